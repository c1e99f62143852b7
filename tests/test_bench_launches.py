"""bench/launches.py: a launch's console lines timed as they arrive, the launch stopped with every process of its group
on timeout or when the benchmark itself is stopped, and rounds in A B / B A order."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import launches

PRINT_SLEEP_PRINT = "import time; print('first', flush=True); time.sleep(0.6); print('second', flush=True)"
# A launcher whose child (a rank) is in the launcher's group and outlives any timeout unless it is stopped.
HANGS = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open("child.pid", "w").write(str(child.pid))
print("started", flush=True)
time.sleep(120)
"""


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0) until its parent reaps it; ours is an orphan that init reaps.
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def wait_until_gone(pid: int, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return gone(pid)


def test_every_console_line_carries_the_seconds_after_the_start_at_which_it_arrived(tmp_path: Path):
    finished = launches.run([sys.executable, "-u", "-c", PRINT_SLEEP_PRINT], tmp_path / "run", timeout_s=30)
    assert finished.returncode == 0
    assert [text for _, text in finished.lines] == ["first\n", "second\n"]
    (first, _), (second, _) = finished.lines
    assert 0 < first < second
    assert second - first >= 0.55
    log = (tmp_path / "run" / "console.log").read_text().splitlines()
    assert [line.split(maxsplit=1) for line in log] == [[f"{first:.2f}", "first"], [f"{second:.2f}", "second"]]


def test_a_launch_runs_in_its_own_directory_which_is_its_output_root(tmp_path: Path):
    script = "import os; print(os.getcwd()); print(os.environ['SRUNSH_OUTPUT_ROOT'])"
    script += "; print(os.environ['SRUNSH_GPUS_PER_NODE'])"
    finished = launches.run([sys.executable, "-c", script], tmp_path / "a", 30, env={"SRUNSH_GPUS_PER_NODE": "1"})
    assert [text.strip() for _, text in finished.lines] == [str(tmp_path / "a"), str(tmp_path / "a" / "outputs"), "1"]


def test_a_launch_past_its_timeout_is_stopped_with_every_process_of_its_group(tmp_path: Path):
    started = time.monotonic()
    finished = launches.run([sys.executable, "-c", HANGS], tmp_path / "hang", timeout_s=3)
    assert finished.returncode == "timeout 3 s"
    assert [text for _, text in finished.lines] == ["started\n"]
    assert time.monotonic() - started < 30
    assert wait_until_gone(int((tmp_path / "hang" / "child.pid").read_text()))


def test_stopping_the_benchmark_stops_the_launch_in_flight(tmp_path: Path):
    """What `timeout` or the device's limit does to a benchmark: SIGTERM, on which launches.stop_on_sigterm exits."""
    previous = signal.getsignal(signal.SIGTERM)
    launches.stop_on_sigterm()
    signal.setitimer(signal.ITIMER_REAL, 2)
    signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
    try:
        with pytest.raises(SystemExit) as stopped:
            launches.run([sys.executable, "-c", HANGS], tmp_path / "hang", timeout_s=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, previous)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert wait_until_gone(int((tmp_path / "hang" / "child.pid").read_text()))
    assert (tmp_path / "hang" / "console.log").read_text().endswith("started\n")


# A launcher that starts a process in a session of its own (as a rank's worker pool can be) and exits at once.
LEAVES_ONE = """
import subprocess, sys
quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "start_new_session": True}
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], **quiet)
open("child.pid", "w").write(str(child.pid))
print("started", flush=True)
"""


def test_a_process_a_launch_leaves_running_is_named_and_killed_and_no_other_process_is(tmp_path: Path):
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    # another launch's process, and one with no launch's directory: neither belongs to this launch
    other = subprocess.Popen(sleeper, env={**os.environ, "SRUNSH_OUTPUT_ROOT": str(tmp_path / "other" / "outputs")})
    unrelated = subprocess.Popen(sleeper)
    try:
        finished = launches.run([sys.executable, "-c", LEAVES_ONE], tmp_path / "left", timeout_s=30)
        assert finished.returncode == 0
        assert finished.left_behind == [Path(sys.executable).name]
        assert wait_until_gone(int((tmp_path / "left" / "child.pid").read_text()))
        assert other.poll() is None and unrelated.poll() is None
    finally:
        for process in (other, unrelated):
            process.kill()
            process.wait()


def test_a_launch_that_ends_with_its_processes_leaves_none(tmp_path: Path):
    finished = launches.run([sys.executable, "-c", "print('done')"], tmp_path / "clean", timeout_s=30)
    assert (finished.returncode, finished.left_behind) == (0, [])


def test_rounds_alternate_which_launch_goes_first():
    assert launches.ab_rounds(3) == [(0, "A"), (0, "B"), (1, "B"), (1, "A"), (2, "A"), (2, "B")]


def test_ratios_pair_the_launches_of_each_round_and_skip_warm_ups_and_missing_values():
    runs = [
        {"round": None, "launch": "A", "s": 1.0},  # warm-up
        {"round": None, "launch": "B", "s": 9.0},
        {"round": 0, "launch": "A", "s": 52.0},
        {"round": 0, "launch": "B", "s": 50.0},
        {"round": 1, "launch": "B", "s": 40.0},
        {"round": 1, "launch": "A", "s": 41.0},
        {"round": 2, "launch": "A", "s": None},  # never got there
        {"round": 2, "launch": "B", "s": 45.0},
    ]
    assert launches.per_round(runs, "s") == [1.04, 1.025]
    assert launches.per_round(runs, "s", over=("B", "A")) == [round(50 / 52, 4), round(40 / 41, 4)]
    assert launches.spread([1.04, 1.025]) == "median 1.032, range 1.025-1.040 over 2"


def test_both_launches_get_the_same_recipe_and_overrides():
    a = launches.ours("recipes/tiny_gpt_pretrain.py", "train.train_iters=3", *launches.MEASURED)
    b = launches.upstream("recipes/tiny_gpt_pretrain.py", "train.train_iters=3", *launches.MEASURED, gpus=2)
    assert a[:2] == [str(launches.REPO / "srun.sh"), "--local"]
    assert b[:5] == [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-port=29500"]
    assert b[5] == str(launches.REPO / "bench" / "upstream_pretrain.py")
    assert a[2:] == b[6:]
    assert "model.gradient_accumulation_fusion=false" in a
