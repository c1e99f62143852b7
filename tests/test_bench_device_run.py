"""bench/device_run.sh, run as on the GPU machine, with a stand-in for the benchmark it starts (which needs GPUs): the
GPUs it finds, what it asks of each case, what it leaves under $OUT, and that one failing case does not stop the
next."""

import os
import stat
import subprocess
import tarfile
from pathlib import Path

from tests.conftest import REPO

NVIDIA_SMI = """#!/usr/bin/env bash
for i in $(seq 0 $((GPUS - 1))); do echo "GPU $i: NVIDIA H200 (UUID: GPU-0000000$i)"; done
"""
# Stands for `python3 bench/bench_startup.py PREFIX --case C ... --runs-dir DIR`: records its arguments, writes the
# prefix's table and one launch's console log, and fails for the case named in FAIL_CASE.
BENCH = """#!/usr/bin/env bash
echo "$*" >>"$CALLS"
prefix=$2 case=$4 runs=${*: -1}
mkdir -p "$runs/0-A"
echo "    1.00  0: [after dataloaders are built]" >"$runs/0-A/console.log"
echo "# Start-up A/B, $case" >"$prefix.md"
echo "bench $case done"
[[ $case != "${FAIL_CASE:-}" ]]
"""


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def device_run(tmp_path: Path, gpus: int, **env: str) -> subprocess.CompletedProcess:
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
    command = ["bash", str(REPO / "bench" / "device_run.sh")]
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=60, check=False)


def test_both_cases_run_on_the_gpus_found_and_leave_their_tables_log_and_consoles(tmp_path: Path):
    done = device_run(tmp_path, gpus=1)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    out = tmp_path / "out"
    assert [call.split()[:4] for call in calls] == [
        ["bench/bench_startup.py", f"{out}/startup-tiny", "--case", "tiny"],
        ["bench/bench_startup.py", f"{out}/startup-llama8b-shape", "--case", "llama8b-shape"],
    ]
    assert "--gpus 1 --rounds 2 --warmup 1 --timeout 150" in calls[0]
    assert "--gpus 1 --rounds 2 --warmup 0 --timeout 150" in calls[1]
    assert sorted(p.name for p in out.iterdir()) == [
        "console-logs.tar.gz",
        "device_run.log",
        "startup-llama8b-shape.md",
        "startup-tiny.md",
    ]
    assert "bench llama8b-shape done" in (out / "device_run.log").read_text()
    with tarfile.open(out / "console-logs.tar.gz") as logs:
        assert sorted(logs.getnames()) == ["./llama8b-shape/0-A/console.log", "./tiny/0-A/console.log"]


def test_more_than_two_gpus_run_as_two_and_a_failed_case_does_not_stop_the_next(tmp_path: Path):
    done = device_run(tmp_path, gpus=8, FAIL_CASE="tiny", ROUNDS="3")
    assert done.returncode == 1
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert len(calls) == 2 and all("--gpus 2 --rounds 3" in call for call in calls)
    assert "device_run.sh: tiny ended with status 1" in (tmp_path / "out" / "device_run.log").read_text()


def test_without_a_gpu_or_out_it_refuses_at_once(tmp_path: Path):
    done = device_run(tmp_path, gpus=0)
    assert done.returncode == 1
    assert "nvidia-smi lists no GPU" in done.stderr
    assert not (tmp_path / "calls.txt").exists()
    done = subprocess.run(["bash", str(REPO / "bench" / "device_run.sh")], env={**os.environ, "OUT": ""},
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 1 and "OUT is not a directory" in done.stderr
