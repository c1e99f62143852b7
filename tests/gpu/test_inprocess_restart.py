"""In-process restart and straggler detection on real GPUs (issue 36), through `srun.sh --local`, with the tiny recipe
and a fault from tests/gpu/faulty_tiny_gpt_pretrain.py. Each records, through `record`: seconds from the fault to the
next completed step, and the steps lost (the fault's step minus the step training went on from).

    (a) a RuntimeError in rank 0's training step, in-process restart on: training goes on in the same process;
    (b) SIGKILL of rank 1 with a spare rank (granularity=rank, active_world_size=2 of 3): needs 3 GPUs; one H200
        cannot give it, since a rank that survives must be another process, rank 0 hosts the stores of Megatron
        Bridge (MASTER_PORT+1) and NVRx (MASTER_PORT+2), and a spare needs a GPU of its own;
    (c) the same RuntimeError today: the launch fails, and the same SRUNSH_RUN_ID resumes from the last checkpoint;
    (d) straggler detection: a thread of the rank loads its GPU from a step on; the detector must name the rank
        (individual score), and stop training with stop_if_detected=true. On a shared GPU it cannot (its xfail).

    pytest tests/gpu/test_inprocess_restart.py -m gpu          (on a GPU host, from the checkout, with the stack)
"""

import re
import statistics

import pytest
import torch

from tests.gpu.conftest import REPO

pytestmark = pytest.mark.gpu

RECIPE = str(REPO / "tests" / "gpu" / "faulty_tiny_gpt_pretrain.py")
ITERS, FAULT_AT, SAVE_EVERY = 40, 17, 5
COMMON = (
    f"train.train_iters={ITERS}",
    "validation.eval_interval=1000",
    "model.gradient_accumulation_fusion=false",
    f"checkpoint.save_interval={SAVE_EVERY}",
    f"fault_at_step={FAULT_AT}",
)
RESTART = ("inprocess_restart.enabled=true", "inprocess_restart.granularity=rank")
RESTART_LINE = re.compile(r"entrypoint\.py: restart 1 at .*; step (?P<step>\d+) completed (?P<s>[0-9.]+) s later")
RESUMED = re.compile(r"iteration\s+(?P<step>\d+)/")


def test_a_raise_restarts_in_place_and_training_completes(launch, record):
    # A whole run takes about 80 s on the H200; a restart that never comes is ended by NVRx's hard timeout (90 s).
    run = launch(RECIPE, *COMMON, *RESTART, "fault=raise", "fault_rank=0", gpus=1, timeout=300)
    restart = RESTART_LINE.search(run.log)
    record(
        run,
        case="a: raise, in-process",
        seconds_to_next_step=restart and float(restart["s"]),
        steps_lost=restart and FAULT_AT - int(restart["step"]) + 1,
    )

    assert run.returncode == 0, run.log[-4000:]
    assert restart is not None, run.log[-4000:]
    assert max(run.losses) == ITERS


@pytest.mark.skipif(torch.cuda.device_count() < 3, reason="a killed rank with a spare needs 3 GPUs (docstring)")
def test_a_killed_rank_is_replaced_by_the_spare_and_training_completes(launch, record):
    spare = ("inprocess_restart.active_world_size=2",)
    run = launch(RECIPE, *COMMON, *RESTART, *spare, "fault=kill", "fault_rank=1", gpus=3)
    restart = RESTART_LINE.search(run.log)
    record(
        run,
        case="b: SIGKILL, spare",
        seconds_to_next_step=restart and float(restart["s"]),
        steps_lost=restart and FAULT_AT - int(restart["step"]) + 1,
    )

    assert run.returncode == 0, run.log[-4000:]
    assert "training completed after in-process restart; rank(s) 1 on" in run.log


@pytest.mark.parametrize("async_save", ["false", "true"], ids=["sync", "async"])
def test_with_local_checkpoints_a_raise_goes_on_from_the_newest_local_one(launch, record, tmp_path, async_save):
    """Local checkpoints on (issue 67), their folder and interval left to srun.sh: on SRUNSH_LOCAL_CKPT_DIR, at an
    interval chosen from the first save's cost (SRUNSH_MTBF_S=60 s makes it a few steps), and the restart reloads
    the newest; with persistent saves synchronous and asynchronous (the defaults issue 67 asks for: on the H100 the
    asynchronous run did not end in 300 s, bench/results/goodput.md, so a hang leaves its report in the record)."""
    env = {"SRUNSH_LOCAL_CKPT_DIR": str(tmp_path), "SRUNSH_MTBF_S": "60", "SRUNSH_HANG_TIMEOUT_S": "90"}
    common = (*(o for o in COMMON if not o.startswith("checkpoint.")), "fault=raise", "fault_rank=0")
    common += ("checkpoint.non_persistent_ckpt_type=local", f"checkpoint.async_save={async_save}")
    run = launch(RECIPE, *common, *RESTART, gpus=1, env=env, timeout=300)
    restart = re.search(r"resumed from the local checkpoint of step (?P<from>\d+) \((?P<again>\d+) step", run.log)
    chosen = re.search(r"a local checkpoint held training [0-9.]+ s: one every (?P<every>\d+) step", run.log)
    record(
        run,
        case=f"e: raise, in-process, local checkpoints, async_save={async_save}",
        hang_report=report.read_text()[-6000:]
        if run.run_dir and (report := run.run_dir / "hang-report.txt").exists()
        else None,
        seconds_to_next_step=(line := RESTART_LINE.search(run.log)) and float(line["s"]),
        steps_lost=restart and int(restart["again"]) + 1,
    )

    assert run.returncode == 0, run.log[-4000:]
    assert chosen is not None and restart is not None, run.log[-4000:]
    assert FAULT_AT - 1 - int(restart["from"]) < max(int(chosen["every"]), 3), run.log[-4000:]
    assert max(run.losses) == ITERS


def test_today_a_raise_stops_the_launch_and_the_resume_goes_on_from_the_checkpoint(launch, record, tmp_path):
    # The same run: its id and its output root (a run id names a run within one SRUNSH_OUTPUT_ROOT).
    env = {"SRUNSH_RUN_ID": "inprocess-today", "SRUNSH_OUTPUT_ROOT": str(tmp_path / "outputs")}
    failed = launch(RECIPE, *COMMON, "fault=raise", "fault_rank=0", gpus=1, env=env)
    no_fault = (*(o for o in COMMON if not o.startswith("fault_at_step=")), "fault_at_step=0")
    resumed = launch(RECIPE, *no_fault, gpus=1, env=env)
    first = min(resumed.losses) if resumed.losses else None
    record(
        resumed,
        case="c: raise, stop and resume",
        seconds_to_next_step=(failed.wall_s - (failed.first_step_s or 0)) + (resumed.first_step_s or 0),
        steps_lost=first and FAULT_AT - first + 1,
    )

    assert failed.returncode == 1, failed.log[-4000:]
    assert resumed.returncode == 0, resumed.log[-4000:]
    assert first == (FAULT_AT - 1) // SAVE_EVERY * SAVE_EVERY + 1


# What one shared GPU cannot show (measured on the H200, bench/results/gpu-suite.md): NVRx scores a GPU by how long
# its kernels run (CUPTI), and a load on the same GPU makes the rank's kernels wait, not run slower. A second process
# made steps 32% longer with every individual score at 0.986-1.0; this thread load made them 17-33 s long (from
# 0.4 s) with the one report after it at 1.0, and the run never reached its end within 440 s. A GPU whose kernels run
# slower (clocks, heat) is what the detector sees; setting clocks is not for a test to do.
@pytest.mark.xfail(strict=True, reason="NVRx's GPU scores time kernels; a load on a shared GPU only delays them")
def test_a_loaded_gpu_is_named_by_the_straggler_detector_and_stops_training_with_stop_if_detected(launch, record):
    """A report every 5 s; from step LOAD_AT a thread of the rank loads its GPU. The detector's individual score (the
    rank against its own earlier pace) must name rank 0, and with stop_if_detected=true training stops well before
    train_iters, with the straggler named in the line that says so."""
    detect = (
        "nvrx_straggler.enabled=true",
        "nvrx_straggler.report_time_interval=5",
        "nvrx_straggler.stop_if_detected=true",
    )
    load_at, iterations = 150, 160
    run = launch(
        RECIPE,
        f"train.train_iters={iterations}",
        "validation.eval_interval=100000",
        "checkpoint.save=null",
        "model.gradient_accumulation_fusion=false",
        *detect,
        "fault=load",
        "fault_rank=0",
        f"fault_at_step={load_at}",
        gpus=1,
        timeout=300,  # 10 loaded steps took 17-33 s each on the H200
    )
    named = re.search(r"entrypoint\.py: straggler \(individual score below threshold\): rank 0 on \S+", run.log)
    stopped = re.search(
        r"entrypoint\.py: training stops \(nvrx_straggler\.stop_if_detected=true\): straggler\(s\) rank 0 on \S+",
        run.log,
    )
    scores = (run.run_dir / "stragglers.log").read_text() if run.run_dir else ""
    last = max(run.losses, default=None)
    record(
        run,
        case="d: straggler",
        named=named and named.group(0),
        stop_line=stopped and stopped.group(0),
        last_step=last,
        load_from_step=load_at,
        score_reports=scores.count("GPU individual performance"),
        step_ms_before_load=median_ms(run, range(20, load_at)),
        step_ms_under_load=median_ms(run, range(load_at + 5, (last or 0) + 1)),
    )

    assert run.returncode == 0, run.log[-4000:]
    assert named is not None and stopped is not None, run.log[-4000:]
    assert load_at < last < iterations, last
    assert scores.count("GPU individual performance") >= 2


def median_ms(run, steps: range) -> float | None:
    times = [run.step_ms[i] for i in steps if i in run.step_ms]
    return statistics.median(times) if times else None
