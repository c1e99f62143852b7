"""bench/bench_goodput.py and bench/goodput_recipe.py without a GPU: the timeline a run writes read into per-fault,
per-save and goodput figures (against a simulated run that knows its own truth, and hypothesis's runs), the faults'
schedule and their spacing through a real launch of a stand-in rank, the rank found in a real process tree, the
recipe's SIGUSR1 raised inside a training step, the report, and both arms' commands through srun.sh --dry-run."""

import json
import os
import signal
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import bench_goodput, bench_startup, goodput_recipe, launches
from tests.conftest import REPO

T0 = 1796117746.25  # epoch seconds of the first completed step


def simulate(step_s: float, every: int, held_s: float, faults: list[tuple[int, float, float]], steps: int) -> dict:
    """The timeline.log of a run that completes a step every step_s, holds training held_s to save after every
    EVERY-th step, and for each (after step, fraction of the next step, restart seconds) raises a fault that far into
    the next step and goes on from its newest save: its lines (as rank 0 writes them) and what really happened."""
    lines, truth, at, step, saved, best, pending = [], {"faults": [], "steps_s": 0.0, "held": []}, T0, 1, 0, 1, faults
    lines.append(f"{at:.3f} 1 training")
    while step < steps:
        if pending and pending[0][0] == step:
            (_, fraction, restart_s), pending = pending[0], pending[1:]
            raised = at + fraction * step_s
            lines.append(f"{raised + 0.1:.3f} {step} restarting")
            at, trained_again, from_step, step = raised + restart_s + step_s, step - saved, saved, saved + 1
            truth["faults"].append({"at": raised, "to_next_step_s": restart_s + step_s, "from_step": from_step,
                                    "trained_again": trained_again, "newest_save": saved or None})  # fmt: skip
        else:
            at, step = at + step_s, step + 1
            truth["steps_s"] += step_s if step > best else 0.0
        best = max(best, step)
        lines.append(f"{at:.3f} {step} {'saving' if step % every == 0 else 'training'}")
        if step % every == 0:
            lines += [f"{at + held_s:.3f} {step} saved", f"{at + held_s:.3f} {step} training"]
            at, saved = at + held_s, step
            truth["held"].append(held_s)
    return {"text": "\n".join(lines) + "\n", "end": at + 0.5, **truth}


RUN = simulate(1.5, 10, 6.0, [(17, 0.5, 2.0), (31, 0.2, 3.0), (40, 0.5, 2.5)], 48)


def test_a_timeline_is_read_to_the_last_whole_record_and_past_lines_it_cannot_read():
    text = "1796117746.2 1 training\nnot a record\n1796117747.5 2 -1\n1796117748.8 2 saving\n1796117749.1 2 sav"
    assert bench_goodput.timeline(text) == [(1796117746.2, 1, "training"), (1796117748.8, 2, "saving")]


def test_each_fault_costs_its_restart_and_the_steps_since_the_newest_save():
    records = bench_goodput.timeline(RUN["text"])
    done = bench_goodput.completions(records)
    costs = [bench_goodput.fault_cost(records, done, fault["at"]) for fault in RUN["faults"]]
    assert [(c["from_step"], c["trained_again"], c["newest_save"]) for c in costs] == [
        (10, 7, 10),
        (30, 1, 30),
        (40, 0, 40),
    ]
    assert [c["to_next_step_s"] for c in costs] == pytest.approx([3.5, 4.5, 4.0], abs=0.01)


def test_a_save_costs_what_it_held_training_over_the_median_step():
    records = bench_goodput.timeline(RUN["text"])
    done = bench_goodput.completions(records)
    saves = bench_goodput.save_costs(records, done, 1.5)
    assert [s["step"] for s in saves] == [10, 20, 30, 40]
    assert [s["held_s"] for s in saves] == pytest.approx([6.0] * 4, abs=0.01)
    assert [s["extra_s"] for s in saves[:3]] == pytest.approx([6.0] * 3, abs=0.01)
    # Only the steps after a save with no restart since it: after 30, 31 (31 again followed the fault in step 32);
    # after 40, none (the fault in step 41).
    assert [s["steps_after"] for s in saves] == [3, 3, 1, 0]
    assert saves[-1]["extra_s"] is None  # not measured
    cut = [i for i, (_, step, _) in enumerate(records) if step == 22][-1] + 1  # the run ends two steps after a save
    last = bench_goodput.save_costs(records[:cut], bench_goodput.completions(records[:cut]), 1.5)[-1]
    assert (last["step"], last["steps_after"], last["extra_s"]) == (20, 2, pytest.approx(6.0, abs=0.01))


@settings(max_examples=100, deadline=None)
@given(
    step_s=st.floats(0.2, 5.0),
    every=st.integers(2, 30),
    held_s=st.floats(0.0, 40.0),
    faults=st.lists(st.tuples(st.integers(1, 120), st.floats(0.01, 0.99), st.floats(0.5, 30.0)), max_size=5),
)
def test_the_timeline_of_any_run_splits_its_time_after_step_1_as_the_run_spent_it(step_s, every, held_s, faults):
    faults = sorted({after: (after, fraction, restart) for after, fraction, restart in faults}.values())
    run = simulate(step_s, every, held_s, faults, 150)
    records = bench_goodput.timeline(run["text"])
    done = bench_goodput.completions(records)
    split = bench_goodput.goodput(records, done, run["end"])
    seconds, rounding = [split[key] for key in ("steps", "checkpoints", "faults", "rest")], 1e-3 * len(records)
    assert sum(seconds) == pytest.approx(run["end"] - T0, abs=rounding)
    assert split["checkpoints"] == pytest.approx(sum(run["held"]), abs=rounding)
    assert split["steps"] == pytest.approx(run["steps_s"], abs=rounding)  # a step after a restart is the fault's
    assert split["goodput"] == pytest.approx(run["steps_s"] / (run["end"] - T0), abs=1e-3)
    for fault in run["faults"]:
        cost = bench_goodput.fault_cost(records, done, fault["at"])
        assert cost["to_next_step_s"] == pytest.approx(fault["to_next_step_s"], abs=0.01)
        assert {k: cost[k] for k in ("from_step", "trained_again")} == {
            k: fault[k] for k in ("from_step", "trained_again")
        }


@given(
    fractions=st.lists(st.floats(0.0, 0.999), max_size=8),
    start=st.floats(0, 1e4),
    length=st.floats(-50, 600),
    gap_s=st.floats(1, 120),
)
def test_the_faults_moments_lie_in_their_window_gap_s_apart_and_as_many_as_fit(fractions, start, length, gap_s):
    end = start + length
    moments = bench_goodput.schedule(fractions, start, end, gap_s)
    fit = 0 if end < start else int((end - start) // gap_s) + 1
    assert len(moments) == min(len(fractions), fit)
    assert all(start - 1e-6 <= moment <= end + 1e-6 for moment in moments)
    assert all(later - earlier >= gap_s - 1e-6 for earlier, later in pairwise(moments))
    assert moments == bench_goodput.schedule(fractions, start, end, gap_s)


# A rank as the bench sees it: named python3 .../entrypoint.py, started below a launcher whose command line names the
# script too (torchrun's does); it writes RUN_DIR/hang/progress.json after every step. On SIGUSR1 it notes when and in
# which step, and, as a fault held through a save: records nothing for a while, then its step again (a save's own
# record), then "restarting"; and goes on a step back, as an in-process restart would. FAULT_S in all.
FAULT_S = 0.2 + 0.2 + 0.4
STAND_IN_RANK = """
import json, os, signal, sys, time
run_dir, got, step = sys.argv[1], [], 0
signal.signal(signal.SIGUSR1, lambda *_: got.append(step))
def record(phase):
    path = os.path.join(run_dir, "hang", "progress.json")
    open(path + ".tmp", "w").write(json.dumps({"step": step, "phase": phase, "time": time.time()}))
    os.replace(path + ".tmp", path)
def wait(seconds):  # a line every 20 ms meanwhile, so that the bench polls often
    for _ in range(int(seconds / 0.02)):
        time.sleep(0.02)
        print("waiting", flush=True)
os.makedirs(os.path.join(run_dir, "hang"))
child = os.fork()  # a worker of the rank's, with its command line
if child == 0:
    time.sleep(60)
    os._exit(0)
while True:
    time.sleep(0.05)
    if got and got[-1] is not None:
        open(os.path.join(run_dir, "faults"), "a").write(f"{os.getpid()} {got[-1]} {time.time()}\\n")
        got.append(None)
        wait(0.2)
        record("training")
        wait(0.2)
        step += 1  # the signal may land a step after the one the bench saw: the restart names the next
        record("restarting")
        wait(0.4)
        step = max(0, step - 3)
    step += 1
    record("training")
    print("step", step, flush=True)
"""


def stand_in_launch(tmp_path: Path) -> list[str]:
    script = tmp_path / "rank" / "entrypoint.py"
    script.parent.mkdir()
    script.write_text(STAND_IN_RANK)
    launcher = f"import subprocess, sys; subprocess.run([sys.executable, {str(script)!r}, sys.argv[1]])"
    return [sys.executable, "-c", launcher, str(tmp_path / "run"), "--rank-exec", "python3", str(script)]


def test_faults_go_to_the_rank_at_their_moments_once_a_step_completed_since_the_last(tmp_path: Path):
    """The moments come close together, so that the second and third wait for the fault before them to end."""
    run_dir, gap_s = tmp_path / "run", 0.3
    faults = bench_goodput.Faults(run_dir, [0.02, 0.04, 0.06], time.time() + 4.5, gap_s)
    finished = launches.run(stand_in_launch(tmp_path), tmp_path / "launch", 5.0, each_poll=faults.poll)
    assert isinstance(finished.returncode, str)  # stopped at its time limit
    received = [line.split() for line in (run_dir / "faults").read_text().splitlines()]
    assert len(faults.sent) == len(received) == 3
    sent = [fault["sent_at"] for fault in faults.sent]
    assert all(at >= moment for at, moment in zip(sent, faults.moments, strict=True))
    assert all(later - earlier >= gap_s for earlier, later in pairwise(sent))
    assert all(sent[n] > float(received[n - 1][2]) + FAULT_S for n in (1, 2))  # not before the rank stepped again
    assert len({pid for pid, _, _ in received}) == 1  # the rank, never its forked worker
    assert all(int(step) >= fault["after_step"] for (_, step, _), fault in zip(received, faults.sent, strict=True))


def test_the_rank_is_the_oldest_python_running_entrypoint_py_below_the_launch(tmp_path: Path):
    script = tmp_path / "entrypoint.py"
    script.write_text("import os, time\nprint(os.getpid(), flush=True)\nos.fork()\ntime.sleep(30)\n")
    launcher = f"import subprocess, sys; subprocess.run([sys.executable, {str(script)!r}])"
    started = subprocess.Popen([sys.executable, "-c", launcher, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        rank = int(started.stdout.readline())
        deadline = time.monotonic() + 10
        while len(launches.process_tree(started.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(launches.process_tree(started.pid)) == 3
        assert bench_goodput.rank_pid(started.pid) == rank
    finally:
        for process in launches.process_tree(started.pid)[::-1]:
            process.kill()
        started.wait()


@pytest.fixture
def fault_signal():
    previous = signal.signal(signal.SIGUSR1, goodput_recipe.fault)
    goodput_recipe.PENDING["fault"] = False
    yield
    signal.signal(signal.SIGUSR1, previous)


def test_a_fault_signal_during_a_training_step_is_raised_at_the_start_of_the_next(fault_signal, capfd):
    def step(*_: object) -> str:
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)
        return "completed"

    faulty = goodput_recipe.with_faults(step)
    assert faulty() == "completed"  # the step it came in completes: a fault inside it broke FP8 state
    with pytest.raises(RuntimeError, match="bench fault"):
        faulty()
    assert "goodput_recipe: bench fault at " in capfd.readouterr().out


def test_a_fault_signal_between_steps_is_raised_at_the_start_of_the_next(fault_signal):
    calls = []
    faulty = goodput_recipe.with_faults(lambda: calls.append("step"))
    faulty()
    os.kill(os.getpid(), signal.SIGUSR1)  # delivered before kill() returns: the handler runs at once
    with pytest.raises(RuntimeError, match="bench fault"):
        faulty()
    assert calls == ["step"]
    faulty()
    assert calls == ["step", "step"]


def test_an_arm_is_read_from_its_run_and_checked_against_issue_67s_targets(tmp_path: Path):
    run_dir = tmp_path / "run"
    (run_dir / "hang").mkdir(parents=True)
    (run_dir / "hang" / "timeline.log").write_text(RUN["text"])
    started = T0 - 45.0
    total = {"wall_s": RUN["end"] - started + 0.4, "after_first_step_s": RUN["end"] - T0, "goodput": 0.91}
    (run_dir / "goodput.json").write_text(json.dumps({"attempts": [], "total": total}))
    lines = [
        (45.0, "0:  [2026-12-07 10:00:42] iteration        1/    5000 | elapsed time per iteration (ms): 9630.2 |")
    ]
    lines += [(70.0, f"0: goodput_recipe: bench fault at {fault['at']:.3f}\n") for fault in RUN["faults"]]
    finished = launches.Finished("timeout 270 s", round(RUN["end"] - started, 1), lines, [])
    sent = [
        {"sent_at": fault["at"] - 0.3, "after_step": step}
        for fault, step in zip(RUN["faults"], (17, 31, 40), strict=True)
    ]
    row = bench_goodput.analyse(run_dir, finished, started, sent)
    assert [f["to_next_step_s"] for f in row["faults"]] == pytest.approx([3.5, 4.5, 4.0], abs=0.01)
    assert row["median_step_s"] == pytest.approx(1.5, abs=0.001) and row["first_step_s"] == 45.0
    row |= {"checkpoint_gb": 26.9, "disk_free_gb": 40.2, "checks": bench_goodput.checks("B", row)}
    met = {what.split(" (")[0]: ok for what, _, _, ok in row["checks"]}
    assert met == {
        "goodput.json's wall and time after step 1 off the bench's": True,
        "median seconds from a fault to the next step": True,
        "share of faults that went on from the newest save": True,
        "saves' extra seconds over the time after step 1": False,  # 4 saves of 6 s in 75 s
        "goodput after step 1": False,
    }
    result = {"date": "2026-12-07 10:00 UTC", "hardware": "1 x NVIDIA H100 80GB HBM3", "versions": "torch 2.11.0",
              "faults": 2, "fractions": [0.2, 0.7], "seed": 67, "gap_s": 30, "mtbf_s": 70.0, "arms": {"B": row},
              "commands": {"B": ["srun.sh", "--local"]}}  # fmt: skip
    table = bench_goodput.markdown(result)
    assert "| B | timeout 270 s | " in table and "| 0.91, 0." in table and "| 26.9, 40.2 |" in table
    assert "| B | 17 | 3.5 | 7 | 10 | 10 |" in table and "| B | 10 | 6.0 | 3 | 6.0 |" in table
    assert "| B | goodput after step 1 (goodput.json) | 0.91 | 0.95-1 | False |" in table


def test_the_arms_differ_by_arm_as_saving_today_and_share_bench_startups_shape():
    a, b = (bench_goodput.overrides(arm, 25) for arm in "AB")
    shape = [o for o in bench_startup.case_command("llama8b-shape", 1, None)[1] if o != bench_startup.STEPS]
    assert set(shape) <= set(b) and "model.num_layers=4" in b and "train.global_batch_size=16" in b
    assert set(a) - set(b) == {"checkpoint.save_interval=25", *bench_goodput.TODAY}
    assert set(b) - set(a) == set(bench_goodput.PROPOSED)
    assert "inprocess_restart.enabled=true" in b and "inprocess_restart.granularity=rank" in b
    for arm in (a, b):
        keys = [o.split("=", 1)[0] for o in arm]
        assert len(keys) == len(set(keys))


ISSUE_67_KNOBS = "SRUNSH_LOCAL_CKPT_DIR" in (REPO / "srun.sh").read_text()


@pytest.mark.parametrize(
    "arm", ["A", pytest.param("B", marks=pytest.mark.skipif(not ISSUE_67_KNOBS, reason="issue 67's knobs not in"))]
)
def test_each_arms_launch_passes_srun_shs_dry_run(arm: str, tmp_path: Path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "SRUNSH_GPUS_PER_NODE": "1", "SRUNSH_OUTPUT_ROOT": str(tmp_path)}
    env |= {"SRUNSH_LOCAL_CKPT_DIR": str(tmp_path), "SRUNSH_MTBF_S": "70"} if arm == "B" else {}
    command = launches.ours(bench_goodput.RECIPE, *bench_goodput.overrides(arm, 25))
    dry_run = [command[0], "--dry-run", *command[1:]]
    done = subprocess.run(dry_run, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert " ".join(bench_goodput.overrides(arm, 25)) in done.stdout


def test_the_bench_recipe_on_ddp_with_the_fused_mlp_gathers_parameters_without_overlap():
    """megatron-core 0.19.2's fused MLP misses the DDP parameter-gather hooks Megatron Bridge adds after step 1
    (Megatron-LM PR #6132): the bench's DDP run must not overlap the gather, on both of the configs that must agree."""
    cfg = goodput_recipe.configure()
    try:
        assert cfg.model.use_transformer_engine_op_fuser and not cfg.ddp.use_megatron_fsdp
        assert (cfg.ddp.overlap_param_gather, cfg.optimizer.overlap_param_gather) == (False, False)
        assert cfg.checkpoint.ckpt_format == "torch_dist"
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
