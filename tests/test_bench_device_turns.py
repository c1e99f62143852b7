"""bench/device_turns.sh, run as on the GPU machine with a stand-in for bench_turns.py (which needs GPUs): the plans it
runs in order, the budget each gets, what it leaves under $OUT, and that one failing plan does not stop the next."""

import os
import subprocess
import tarfile
from pathlib import Path

from tests.conftest import REPO
from tests.test_bench_device_run import NVIDIA_SMI, executable

# Stands for `python3 bench/bench_turns.py PREFIX --plan P --gpus G --budget-s B --runs-dir DIR`: records its
# arguments, writes the prefix's table and one arm's console and events, and fails for the plan named in FAIL_PLAN.
BENCH = """#!/usr/bin/env bash
echo "$*" >>"$CALLS"
prefix=$2 plan=$4 runs=${*: -1}
mkdir -p "$runs/ours/outputs/tb_logs"
echo "    1.00  0: iteration 1/ 10" >"$runs/ours/console.log"
echo "events" >"$runs/ours/outputs/tb_logs/events.out.tfevents.1.host"
echo "# Per-step A/B, plan $plan" >"$prefix.md"
[[ $plan != "${FAIL_PLAN:-}" ]]
"""


def device_turns(tmp_path: Path, gpus: int = 1, **env: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "nvidia-smi", NVIDIA_SMI)
    out = tmp_path / "out"
    out.mkdir()
    environment = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "GPUS": str(gpus),
        "OUT": str(out),
        "CALLS": str(tmp_path / "calls.txt"),
        "PYTHON": str(executable(tmp_path / "bench", BENCH)),
        **env,
    }
    command = ["bash", str(REPO / "bench" / "device_turns.sh")]
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=60, check=False)


def test_plans_run_in_order_each_with_its_budget_and_leave_tables_log_and_runs(tmp_path: Path):
    done = device_turns(tmp_path, PLANS="tiny llama8b-ab", TOTAL_S="500", RESERVE_S="40")
    assert done.returncode == 0, done.stdout + done.stderr
    calls = [call.split() for call in (tmp_path / "calls.txt").read_text().splitlines()]
    out = tmp_path / "out"
    assert [call[:4] for call in calls] == [
        ["bench/bench_turns.py", f"{out}/turns-tiny", "--plan", "tiny"],
        ["bench/bench_turns.py", f"{out}/turns-llama8b-ab", "--plan", "llama8b-ab"],
    ]
    assert calls[0][4:8] == ["--gpus", "1", "--budget-s", "150"]  # the tiny plan's share
    assert 400 <= int(calls[1][7]) <= 460  # what is left, less the reserve
    assert sorted(p.name for p in out.iterdir()) == [
        "device_turns.log",
        "runs.tar.gz",
        "turns-llama8b-ab.md",
        "turns-tiny.md",
    ]
    with tarfile.open(out / "runs.tar.gz") as runs:
        assert "./tiny/ours/outputs/tb_logs/events.out.tfevents.1.host" in runs.getnames()
        assert "./llama8b-ab/ours/console.log" in runs.getnames()


def test_a_failed_plan_does_not_stop_the_next_and_the_call_says_so(tmp_path: Path):
    done = device_turns(tmp_path, gpus=2, PLANS="tiny llama8b-levers", FAIL_PLAN="tiny", GPUS_PER_ARM="2")
    assert done.returncode == 1
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert len(calls) == 2 and all("--gpus 2" in call for call in calls)
    assert "device_turns.sh: tiny ended with status 1" in (tmp_path / "out" / "device_turns.log").read_text()


def test_without_a_gpu_it_refuses_at_once(tmp_path: Path):
    done = device_turns(tmp_path, gpus=0)
    assert done.returncode == 1 and "nvidia-smi lists no GPU" in done.stderr
    assert not (tmp_path / "calls.txt").exists()
