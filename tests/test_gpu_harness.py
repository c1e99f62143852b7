"""The GPU suite's launch harness (tests/gpu/conftest.py), on CPU: a launch past its time limit leaves nothing
running, torchrun included, which runs in a process group of its own (a leftover would hold the GPU for every test
after it)."""

import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.gpu.conftest import run_with_time_limit

# A launcher that starts a helper in a session of its own, as srun.sh's supervisor starts torchrun, and then waits.
LAUNCHER = 'setsid sleep 300 & echo "$!" > helper.pid; echo started; sleep 300'


def test_a_launch_past_its_time_limit_is_stopped_with_everything_it_started(tmp_path: Path):
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match=r"still ran after 2 s: it was stopped\nstarted"):
        run_with_time_limit(["bash", "-c", LAUNCHER], cwd=tmp_path, env=dict(os.environ), timeout_s=2)
    helper = int((tmp_path / "helper.pid").read_text())
    assert not psutil.pid_exists(helper) or psutil.Process(helper).status() == psutil.STATUS_ZOMBIE
    assert time.monotonic() - started < 30, "a launcher that ends at SIGTERM is not waited for a minute"


def test_a_launch_within_its_time_limit_keeps_its_output_and_status(tmp_path: Path):
    finished = run_with_time_limit(
        [sys.executable, "-c", "print('one'); print('two'); raise SystemExit(3)"],
        cwd=tmp_path,
        env=dict(os.environ),
        timeout_s=60,
    )
    assert (finished.returncode, finished.lines) == (3, ["one\n", "two\n"])
