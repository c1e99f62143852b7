"""The goodput line (launcher/host/goodput.py): rank 0's step timeline as the real launcher/hang/progress.py writes it,
its split into parts that add up to the wall time (hypothesis over interleaved steps, saves, evaluations, faults and
stops; timelines cut off mid-line), RUN_DIR/goodput.json over a run's attempts, and the line at the end of a real
srun.sh --local launch that completes or is stopped by SIGTERM at a random moment."""

import itertools
import json
import random
import re
import signal
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.hang import progress
from launcher.host import goodput
from tests.srun_world import SrunWorld

pytest_plugins = ["tests.srun_world"]

LINE = re.compile(
    r"srun\.sh: goodput(?: (?P<goodput>\d+\.\d)% of (?P<after>\d+) s after the first step \((?P<all>\d+\.\d)% of all\)"
    r"|: no training step completed in (?P<wall>\d+) s): start-up (?P<start_up>\d+) s, steps (?P<steps>\d+) s,"
    r" checkpoints (?P<checkpoints>\d+) s, (?P<faults>\d+) fault\(s\) (?P<lost>\d+) s \(restarts (?P<restarts>\d+) s,"
    r" (?P<retrained_steps>\d+) step\(s\) trained again (?P<retrained>\d+) s\), waiting (?P<waiting>\d+) s,"
    r" clean-up (?P<clean_up>\d+) s \((?P<path>.+)\)"
)


# ---- Rank 0's timeline ----------------------------------------------------------------------------------------


def test_rank_0_appends_each_record_to_the_timeline_and_a_save_ends_as_saved_there_only(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(progress, "LAST", progress.Last())
    recorder = progress.Recorder(tmp_path, rank=0)
    before = time.time()
    for step, phase, timeline in [(1, "training", ""), (2, "saving", ""), (2, "training", "saved"), (3, "ended", "")]:
        recorder.record(step, phase, timeline)
    progress.Recorder(tmp_path, rank=1).record(3)  # another rank's: in memory only

    lines = (tmp_path / "hang" / progress.TIMELINE_FILE).read_text().splitlines()
    assert [line.split()[1:] for line in lines] == [["1", "training"], ["2", "saving"], ["2", "saved"], ["3", "ended"]]
    first, last = float(lines[0].split()[0]), float(lines[-1].split()[0])
    assert before - 0.001 <= first <= last <= time.time() + 0.001  # rounded to the ms, up or down
    assert progress.read_json(tmp_path / "hang" / progress.PROGRESS_FILE)["phase"] == "ended"


# ---- The split, over runs hypothesis makes ------------------------------------------------------------------------


@st.composite
def runs(draw, exact: bool):
    """A launch as rank 0 records it, and what its split must be. EXACT: every step takes the same time (so the
    typical step is known) and no evaluation; otherwise steps vary and evaluations come."""
    start = draw(st.floats(1.6e9, 1.8e9))
    step_s = draw(st.floats(0.05, 20.0))
    at, records, want = start, [], dict.fromkeys(goodput.PARTS, 0.0)
    step, saved, counted, lost, faults, leads, pending = 0, 0, [], 0, 0, [], "start_up"
    want["start_up"] = draw(st.floats(0.0, 120.0))
    at += want["start_up"]
    actions = ["step"] * 5 + ["save", "fault"] + ([] if exact else ["eval"])
    for action in draw(st.lists(st.sampled_from(actions), max_size=50)):
        if action == "step":
            took = step_s if exact else step_s * draw(st.floats(0.5, 2.0))
            at, step = at + took, step + 1
            if pending == "restarts":
                lost += sum(done >= step for done in counted)
                counted = [done for done in counted if done < step]
            if pending:
                leads.append(pending)
            counted.append(step)
            records.append((at, step, "training"))
            pending = ""
        elif action == "save" and not pending:
            records[-1] = (*records[-1][:2], "saving") if records[-1][2] == "training" else records[-1]
            blocked = draw(st.floats(0.0, 30.0))
            at, saved = at + blocked, step
            want["checkpoints"] += blocked
            records.append((at, step, "saved"))
        elif action == "eval" and not pending:
            at += draw(st.floats(0.0, 5.0))
            records.append((at, step, "training"))
        elif action == "fault":
            lost_s = draw(st.floats(0.0, 60.0))  # the step it interrupted, and the restart until the next step
            at += lost_s
            want[pending or "restarts"] += lost_s
            records.append((at, step, "restarting"))
            step, faults, pending = draw(st.integers(min(saved, step), step)), faults + 1, "restarts"
            saved = min(saved, step)
    ended = draw(st.sampled_from(["completed", "failed", "stopped", "hung", "requeued"]))
    if ended == "completed" and draw(st.booleans()):
        gap = draw(st.floats(0.0, 5.0))
        at += gap
        want[pending or "clean_up"] += gap
        records.append((at, step, "ended"))
    end = at + draw(st.floats(0.0, 100.0))
    done = (ended == "completed" and not pending) or (records and records[-1][2] in ("ended", "saved"))
    want["clean_up" if done else pending or "waiting"] += end - at
    typical = step_s if len(counted) + lost > len(leads) else 0.0  # no step that followed a step: none is typical
    for part in leads:
        want[part] += step_s - typical
    want["steps"], want["retrained"] = len(counted) * typical, lost * typical
    return start, end, records, ended, want, {"faults": faults, "retrained_steps": lost, "counted": counted}


def check_adds_up(attempt: dict) -> None:
    parts = attempt["seconds"]
    assert all(seconds >= -1e-6 for seconds in parts.values()), parts
    assert sum(parts.values()) == pytest.approx(attempt["end"] - attempt["start"], abs=1e-5)


@settings(max_examples=300, deadline=None)
@given(run=runs(exact=False))
def test_the_parts_add_up_to_the_wall_time_and_each_lost_step_is_counted_once(run):
    start, end, records, ended, _, facts = run
    attempt = goodput.split(start, end, records, ended, [])
    check_adds_up(attempt)
    assert len(attempt["faults"]) == facts["faults"]
    assert sum(fault["retrained_steps"] for fault in attempt["faults"]) == facts["retrained_steps"]
    counted = facts["counted"]
    assert attempt["steps"] == ([min(counted), max(counted)] if counted else None)
    assert sum(save["blocked_s"] for save in attempt["saves"]) == pytest.approx(attempt["seconds"]["checkpoints"])
    whole = goodput.total([attempt])
    assert 0.0 <= whole["goodput_all"] <= whole["goodput"] + 1e-9 <= 1.0 + 1e-9


@settings(max_examples=300, deadline=None)
@given(run=runs(exact=True))
def test_with_steps_of_one_length_each_part_is_what_the_run_spent_on_it(run):
    start, end, records, ended, want, _ = run
    attempt = goodput.split(start, end, records, ended, [])
    check_adds_up(attempt)
    assert attempt["seconds"] == pytest.approx(want, abs=1e-4)


# ---- What a launch leaves: the timeline file, restarts.log, goodput.json ------------------------------------------


@settings(max_examples=100, deadline=None)
@given(cut=st.integers(0, 200), junk=st.sampled_from(["", "\n", "12", "1796.5 7 train", "x y z\n"]))
def test_a_timeline_cut_off_mid_line_keeps_its_whole_records_only(tmp_path_factory, cut: int, junk: str):
    """A rank killed mid-write leaves part of a line; what comes after it (JUNK: a part before the records, which a
    later record completes into one line) is lost with it."""
    path = tmp_path_factory.mktemp("hang") / progress.TIMELINE_FILE
    start = 1_796_000_000.0
    whole = [(start + 1.5, 1, "training"), (start + 3.25, 2, "saving"), (start + 4.0, 2, "saved")]
    lines = [f"{at:.3f} {step} {phase}" for at, step, phase in whole]
    text = "".join(line + "\n" for line in lines)
    kept = text[: len(text) - cut % len(text)]
    path.write_text(junk + kept)

    ends = itertools.accumulate(len(line) + 1 for line in lines)  # where each line ends, with its newline
    want = whole[: sum(end - 1 <= len(kept) for end in ends)]
    assert goodput.read_timeline(path, start, start + 10) == (want[1:] if junk and not junk.endswith("\n") else want)


THIS_LAUNCH = (
    "restart 1 at 10:00:31: rank(s) 1 EXCEPTION (rank 1 on node2: RuntimeError('injected')); resumed from the local"
    " checkpoint of step 3 (2 step(s) trained again); step 4 completed 9.8 s later"
)


def launch_timeline(run_dir: Path, start: float, records: list[tuple[float, int, str]]) -> None:
    """As rank 0 leaves it (launcher/hang/progress.py); the supervisor removes hang/ at each launch's start."""
    (run_dir / "hang").mkdir(parents=True, exist_ok=True)
    text = "".join(f"{start + after:.3f} {step} {phase}\n" for after, step, phase in records)
    (run_dir / "hang" / progress.TIMELINE_FILE).write_text(text)


def test_a_run_folders_records_make_the_attempts_and_a_requeued_jobs_line_covers_both(tmp_path: Path, capsys):
    # The first attempt: 2 s steps, a save after step 3, a fault in step 6 that resumes at step 4 (steps 4 and 5 are
    # trained again), training to step 10 and a save there for the time limit; restarts.log holds an earlier
    # launch's line too.
    now = time.time()
    first = now - 300
    steps = [(20.0 + 2 * n, n + 1, "training") for n in range(5)]
    steps[2] = (24.0, 3, "saving")
    steps[3:] = [(25.5, 3, "saved"), (27.5, 4, "training"), (29.5, 5, "training"), (30.7, 5, "restarting")]
    steps += [(40.0 + 2 * n, n + 4, "training") for n in range(7)] + [(53.0, 10, "saved")]
    launch_timeline(tmp_path, first, steps)
    earlier = "restart 1 at 09:00:00: rank(s) 0 TERMINATED; step 4 completed 50.0 s later\n"  # a launch before
    (tmp_path / "restarts.log").write_text(earlier + earlier.replace("step 4", "step 7") + THIS_LAUNCH + "\n")
    goodput.account(tmp_path, first, "requeued")

    (attempt,) = json.loads((tmp_path / "goodput.json").read_text())["attempts"]
    tail = attempt["end"] - (first + 53.0)
    assert attempt["ended"] == "requeued" and attempt["end"] == pytest.approx(now, abs=5)
    want = {"start_up": 18.0, "steps": 20.0, "checkpoints": 2.5, "restarts": 8.5, "retrained": 4.0, "clean_up": tail}
    assert attempt["seconds"] == pytest.approx({**want, "waiting": 0.0}, abs=2e-3)
    assert attempt["faults"] == [
        pytest.approx({"at": first + 30.2, "to_next_step_s": 9.8, "retrained_steps": 2,
                       "retrained_s": 4.0}, abs=2e-3)
    ]  # fmt: skip
    assert [(save["step"], save["blocked_s"]) for save in attempt["saves"]] == [(3, 1.5), (10, 1.0)]
    assert attempt["steps"] == [1, 10] and attempt["first_step_at"] == pytest.approx(first + 18, abs=2e-3)
    said = LINE.fullmatch(capsys.readouterr().out.strip())
    assert said and said["goodput"] == f"{20 / (attempt['end'] - first - 18):.1%}"[:-1], said
    assert (said["faults"], said["retrained_steps"], said["path"]) == ("1", "2", str(tmp_path / "goodput.json"))

    # The requeued job's next attempt resumes from the checkpoint of step 5: steps 6-10 are trained again.
    second = now - 60
    launch_timeline(tmp_path, second, [(10.0 + 2 * n, n + 6, "training") for n in range(10)] + [(29.0, 15, "ended")])
    goodput.account(tmp_path, second, "completed")

    run = json.loads((tmp_path / "goodput.json").read_text())
    assert [attempt["ended"] for attempt in run["attempts"]] == ["requeued", "completed"]
    total, walls = run["total"], sum(attempt["end"] - attempt["start"] for attempt in run["attempts"])
    assert total["wall_s"] == pytest.approx(walls, abs=2e-3)
    assert sum(total[part] for part in goodput.PARTS) == pytest.approx(walls, abs=1e-2)
    assert (total["faults"], total["retrained_steps"]) == (1, 2 + 5)
    assert total["steps"] == pytest.approx(20.0 - 5 * 2.0 + 20.0, abs=1e-2)
    assert total["retrained"] == pytest.approx(4.0 + 5 * 2.0, abs=1e-2)
    assert total["after_first_step_s"] == pytest.approx(walls - 18.0, abs=1e-2)
    said = LINE.fullmatch(capsys.readouterr().out.strip())
    assert said and int(said["after"]) == round(walls - 18.0) and said["retrained_steps"] == "7"


# ---- Through srun.sh --local (tests/fixtures/fake_python's steps, recorded by the real launcher/hang/progress.py) ----


def launch_record(world: SrunWorld, stdout: str) -> tuple[dict, re.Match]:
    """The launch's attempt in goodput.json, whose parts add up to its wall time, and its line, the last on stdout."""
    (run_dir,) = world.run_dirs()
    said = LINE.fullmatch(stdout.splitlines()[-1])
    assert said and said["path"] == str(run_dir / "goodput.json"), stdout[-2000:]
    (attempt,) = json.loads((run_dir / "goodput.json").read_text())["attempts"]
    assert sum(attempt["seconds"].values()) == pytest.approx(attempt["end"] - attempt["start"], abs=1e-2)
    return attempt, said


def test_a_completed_local_launch_ends_in_its_goodput_line(srun_world: SrunWorld):
    began = time.time()
    env = {"SRUNSH_GPUS_PER_NODE": "1", "FAKE_STEPS": "6", "FAKE_STEP_S": "0.1"}
    result = srun_world.srun_sh("--local", "recipe.py", env=env)
    took = time.time() - began

    assert result.returncode == 0, result.stderr
    attempt, said = launch_record(srun_world, result.stdout)
    assert attempt["ended"] == "completed" and attempt["steps"] == [1, 6] and attempt["faults"] == []
    assert began <= attempt["start"] < attempt["first_step_at"] < attempt["end"] <= began + took
    assert 0.5 <= attempt["seconds"]["steps"] <= attempt["end"] - attempt["first_step_at"]
    assert attempt["seconds"]["waiting"] == 0.0 and said["after"] is not None


def test_a_launch_stopped_by_sigterm_at_a_random_moment_still_ends_in_its_goodput_line(srun_world: SrunWorld):
    proc = srun_world.start("--local", "recipe.py", env={"SRUNSH_GPUS_PER_NODE": "1", "FAKE_STEPS": "100"})
    try:
        srun_world.wait_for_ranks(1)  # training started: from here a stop is the launch's
        time.sleep(random.uniform(0.0, 3.0))
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

    assert proc.returncode == 128 + signal.SIGTERM, stderr
    attempt, said = launch_record(srun_world, stdout)
    assert attempt["ended"] == "stopped" and attempt["seconds"]["clean_up"] == 0.0
    assert (said["after"] is None) == (attempt["steps"] is None), said[0]
