"""bench/turns.py, run for real with stand-ins for the launches (they need GPUs): arms take turns, each paused as a
whole process tree while another runs; an arm of the next block waits at its config until its block; every arm is
stopped with its TensorBoard events flushed; a failing arm cuts its block and nothing else. Then bench/bench_turns.py
reads the ratios back from the event files the stand-ins wrote."""

import fcntl
import math
import struct
import sys
import termios
import time
from pathlib import Path

import psutil
import pytest

from bench import bench_startup, bench_turns, launches, turns

# A launch: the launcher starts one rank in a session of its own and passes SIGTERM on (as torchrun does). The rank
# starts a "data loader worker" that writes a heartbeat, prints the config-built line, initializes, then trains: each
# step sleeps STEP_S, logs its time since the previous step (Megatron Bridge's interval timer: a pause lands in the
# step it interrupts) to TensorBoard at its wall time, and prints Megatron Bridge's iteration line. On SIGTERM it ends
# its step, closes the event file and exits 0; with FAIL_AFTER it exits 1 after that many steps.
STAND_IN = r"""
import functools, os, signal, subprocess, sys, time
print = functools.partial(print, flush=True)
role, step_s, fail_after = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
if role == "launcher":
    rank = subprocess.Popen([sys.executable, __file__, "rank", *sys.argv[2:]], start_new_session=True)
    signal.signal(signal.SIGTERM, lambda *_: rank.terminate())
    sys.exit(rank.wait())
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
beat = "import time\nwhile True:\n    print(time.time(), flush=True)\n    time.sleep(0.01)"
worker = subprocess.Popen([sys.executable, "-c", beat], stdout=open("heartbeat.txt", "w"))
writer = EventFileWriter(os.path.join(os.environ["SRUNSH_OUTPUT_ROOT"], "tb_logs"))
def scalar(tag, value, step, wall):
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
    writer.add_event(event_pb2.Event(wall_time=wall, step=step, summary=summary))
time.sleep(0.3)
print("upstream_pretrain.py: config built")
time.sleep(0.3)  # what pretrain() does before its first step
previous, step = time.time(), 0
while not stop:
    time.sleep(step_s)
    step += 1
    now = time.time()
    scalar("iteration-time", now - previous, step, now)
    scalar("lm loss vs samples", 10.0 / step, step * 8, now)
    ms = 1000 * (now - previous)
    print(f" [2026-12-01 10:00:00] iteration {step:8d}/    1000 | elapsed time per iteration (ms): {ms:.1f} |")
    previous = now
    if step == fail_after:
        os._exit(1)
writer.close()
worker.terminate()
"""
STEP_S = {"A": 0.05, "B": 0.08, "C": 0.05, "D": 0.05}


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, Path]:
    """Three blocks: A with B (B slower), A with C (C joins in the second), A with D (D fails); no time limit (as
    without --budget-s)."""
    root = tmp_path_factory.mktemp("turns")
    script = root / "stand_in.py"
    script.write_text(STAND_IN)
    fail_after = {"D": 4}  # in its first turn, after 2 warm-up steps
    arms = {
        name: turns.Arm(
            name=name,
            command=(sys.executable, str(script), "launcher", str(step_s), str(fail_after.get(name, 0))),
            env={},
            tokens_per_step=1000,
            gpus=1,
        )
        for name, step_s in STEP_S.items()
    }
    blocks = [turns.Block(("A", "B"), 3), turns.Block(("A", "C"), 3), turns.Block(("A", "D"), 3)]
    runner = turns.Turns(
        arms, blocks, turn_steps=2, settle=1, runs_dir=root / "runs", deadline=math.inf,
        warmup_timeout_s=30, stall_s=10,
    )  # fmt: skip
    record = runner.run()
    found = {name: launches.scalars(root / "runs" / name) for name in arms}
    return record, found, root / "runs"


def turns_of(record: dict, arm: str) -> list[tuple[float, float]]:
    return [(turn["began"], turn["ended"]) for turn in record["turns"] if turn["arm"] == arm]


def test_the_order_of_turns_rotates_every_round(played):
    record, _, _ = played
    first_block = [turn["arm"] for turn in record["turns"] if turn["block"] == 0]
    assert first_block == ["A", "B", "B", "A", "A", "B"]


def test_no_arm_logs_a_step_or_runs_its_worker_during_another_arms_turn(played):
    record, found, runs = played
    for arm in ("A", "B", "C", "D"):
        others = [(turn["began"], turn["ended"]) for turn in record["turns"] if turn["arm"] != arm]
        walls = [wall for wall, _ in found[arm].get("iteration-time", {}).values()]
        assert walls and not [wall for wall in walls if any(began < wall < ended for began, ended in others)], arm
    beats = [float(line) for line in (runs / "B" / "heartbeat.txt").read_text().split()]
    for began, ended in turns_of(record, "A"):
        assert not [beat for beat in beats if began + 0.02 < beat < ended - 0.02]


def test_an_arm_of_a_later_block_trains_only_once_its_block_comes(played):
    record, found, _ = played
    first_block_ended = max(turn["ended"] for turn in record["turns"] if turn["block"] == 0)
    assert min(wall for wall, _ in found["C"]["iteration-time"].values()) > first_block_ended


def test_every_arm_is_stopped_with_its_events_flushed_and_a_failure_cuts_only_its_block(played):
    record, found, _ = played
    for arm in ("A", "B", "C"):
        assert record["arms"][arm]["retired"] and record["arms"][arm]["returncode"] == 0
        last_turn = [turn for turn in record["turns"] if turn["arm"] == arm][-1]
        assert max(found[arm]["iteration-time"]) >= last_turn["last_step"]
    assert record["arms"]["D"]["failure"]["why"] == "ended during its turn"
    assert record["arms"]["D"]["returncode"] == 1
    assert record["blocks"][2]["cut"] == "after 1 rounds: an arm failed"
    assert "cut" not in record["blocks"][0] and "cut" not in record["blocks"][1]


def test_the_ratios_leave_the_paused_time_out(played):
    record, found, _ = played
    analysis = bench_turns.analyse(record, found)
    slower = analysis["blocks"][0]["spread"]["B"]
    assert 0.5 < slower["median"] < 0.75  # 0.05 s against 0.08 s a step
    assert analysis["blocks"][0]["verdict"]["B"] == "slower, outside the spread"
    assert 0.8 < analysis["blocks"][1]["spread"]["C"]["median"] < 1.25
    assert analysis["arms"]["A"]["step_ms"] < 80


def test_an_arm_that_does_not_warm_up_fails_at_the_plans_deadline_not_the_warm_up_limit(tmp_path: Path):
    """On the H200 an arm whose rank hung in its teardown after an error held its block in the warm-up wait (600 s)
    past the plan's budget, and the plan was killed before it wrote its report."""
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    slow = turns.Arm("S", (sys.executable, str(script), "launcher", "4", "0"), {}, tokens_per_step=1000, gpus=1)
    runner = turns.Turns(
        {"S": slow}, [turns.Block(("S",), 1)], turn_steps=1, settle=0, runs_dir=tmp_path / "runs",
        deadline=time.monotonic() + 2, warmup_timeout_s=600,
    )  # fmt: skip
    record = runner.run()

    assert record["arms"]["S"]["failure"]["why"] == "logged 0 of 2 warm-up steps by the plan's deadline"


def unread(fd: int) -> int:
    """Bytes written to the pipe `fd` reads from that nobody has read yet."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]


def state(process: psutil.Process) -> str | None:
    try:
        return process.status()
    except psutil.NoSuchProcess:
        return None


def test_a_real_srun_sh_launch_is_paused_whole_and_leaves_nothing(tmp_path: Path):
    """srun.sh --local, torchrun and entrypoint.py for real, up to pretrain()'s first line (with no GPU here the rank
    fails soon after it). CUDA_VISIBLE_DEVICES stands in for the GPU that srun.sh counts."""
    env = {"SRUNSH_GPUS_PER_NODE": "1", "CUDA_VISIBLE_DEVICES": "0", "SRUNSH_PYTHON": sys.executable}
    arm = turns.Arm("ours", tuple(launches.ours(launches.TINY, "train.train_iters=3")), env, 1, 1)
    runner = turns.Turns({"ours": arm}, [], 1, 1, tmp_path, deadline=time.monotonic() + 120)
    runner.record = {"arms": {"ours": turns.arm_record(arm)}, "turns": []}
    runner.start("ours")
    live = runner.live["ours"]
    deadline = time.monotonic() + 150
    built = bench_startup.MARKERS["config built"]  # printed just before pretrain(), as in every launch
    while not live.ended and time.monotonic() < deadline:
        if any(built.search(text) for _, text in live.launch.lines):
            break
        runner.pump()
    live.pause()
    assert not live.ended and live.paused, "".join(text for _, text in live.launch.lines[-5:])
    tree = launches.process_tree(live.launch.process.pid)
    assert len(tree) >= 3  # srun.sh, torchrun, ...
    # SIGSTOP takes effect when each process next runs, which on a loaded machine may be a while after kill().
    stopped = time.monotonic() + 10
    while {state(process) for process in tree} != {psutil.STATUS_STOPPED} and time.monotonic() < stopped:
        time.sleep(0.05)
    assert {state(process) for process in tree} == {psutil.STATUS_STOPPED}
    console = live.launch.process.stdout.fileno()
    drained = time.monotonic() + 10
    while unread(console) and time.monotonic() < drained:  # what was in the pipe when it stopped
        time.sleep(0.05)
    time.sleep(0.5)  # the reader thread queues the lines it has read
    runner.pump()
    heard = len(live.launch.lines)
    time.sleep(1.5)
    runner.pump()
    assert unread(console) == 0 and live.launch.lines[heard:] == []  # nothing written while it was paused
    live.resume()
    while len(live.launch.lines) == heard and not live.ended and time.monotonic() < deadline:
        runner.pump(warming=["ours"])  # as when its block comes: paused again only once warmed up
    assert len(live.launch.lines) > heard  # it went on
    runner.retire("ours")
    gone = time.monotonic() + 10
    while [p for p in tree if state(p) not in (None, psutil.STATUS_ZOMBIE)] and time.monotonic() < gone:
        time.sleep(0.1)
    assert not [p for p in tree if state(p) not in (None, psutil.STATUS_ZOMBIE)]
