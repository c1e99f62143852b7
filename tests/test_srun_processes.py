"""A launch is two programs a reader can follow: on the launching host srun.sh and the one supervisor it hands the
launch to (beside srun or torchrun), on every rank srun.sh --rank-exec and launcher/rank/rank.sh. Counted with
strace, as a maintainer would trace a launch: every program started, every bash script opened."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.srun_world import REPO, SQUASHFS_MAGIC, SrunWorld

pytest_plugins = ["tests.srun_world"]

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (tools/setup_test_env.sh)")

EXECVE = re.compile(r'^execve\("([^"]*)", \[(.*)\], .* = 0$')
OPENED = re.compile(r'^openat\(AT_FDCWD, "([^"]*\.sh)", .* = \d+')


def strace(world: SrunWorld, name: str = "trace") -> tuple[str, ...]:
    """strace of a command and every process it starts, a file for each (WORLD's `NAME.PID`): in one file, a call
    that two processes make at once is split over an `<unfinished ...>` and a `<... resumed>` line, as two ranks
    opening rank.sh together were on a loaded machine."""
    return ("strace", "-ff", "-qq", "-s", "4096", "-e", "trace=execve,openat", "-o", str(world.dir / name))


def traced_lines(trace: Path) -> list[str]:
    """The lines of every process's file (TRACE.PID)."""
    files = sorted(trace.parent.glob(f"{trace.name}.*"))
    return [line for file in files for line in file.read_text(errors="replace").splitlines()]


def programs(trace: Path) -> list[tuple[str, str]]:
    """Each program that was started: (its path, its arguments as strace wrote them)."""
    started = []
    for line in traced_lines(trace):
        found = EXECVE.match(line)
        if found:
            started.append((found.group(1), found.group(2)))
    return started


def host_helpers(trace: Path) -> list[str]:
    """The python processes that are neither torchrun nor a rank's program: the launch's own helpers."""
    helpers = []
    for path, argv in programs(trace):
        python = Path(path).name.startswith("python") or Path(path).name == "fake_python"
        rank = "entrypoint.py" in argv or "torch.distributed.run" in argv
        if python and not rank:
            helpers.append(argv)
    return helpers


def bash_files(trace: Path) -> set[str]:
    """The bash scripts any process opened, by path."""
    found = (OPENED.match(line) for line in traced_lines(trace))
    return {match.group(1) for match in found if match}


def test_local_launch_starts_one_host_helper_and_loads_two_bash_files(srun_world: SrunWorld):
    env = {**srun_world.env, "SRUNSH_GPUS_PER_NODE": "2", "CUDA_VISIBLE_DEVICES": "0,1"}
    command = [*strace(srun_world), str(REPO / "srun.sh"), "--local", "recipe.py", "a=1"]
    result = subprocess.run(
        command, cwd=srun_world.dir, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert sorted(srun_world.records()) == [0, 1]
    trace = srun_world.dir / "trace"
    assert len(host_helpers(trace)) == 1, host_helpers(trace)
    assert bash_files(trace) == {str(REPO / "srun.sh"), str(REPO / "launcher" / "rank" / "rank.sh")}


def test_two_node_launch_and_container_dry_run_start_one_host_helper_and_load_one_bash_file(
    slurm_world: SrunWorld, tmp_path: Path
):
    trace = slurm_world.dir / "trace"
    command = strace(slurm_world)
    result, steps = slurm_world.in_allocation("--no-container", "recipe.py", "a=1", command=command)
    assert result.returncode == 0, result.stderr
    assert steps == 1
    assert sorted(slurm_world.records()) == list(range(8))
    assert len(host_helpers(trace)) == 1, host_helpers(trace)
    assert bash_files(trace) == {str(REPO / "srun.sh")}

    image = tmp_path / "image.sqsh"
    image.write_bytes(SQUASHFS_MAGIC)
    env = {"SRUNSH_SQSH": str(image), "SRUNSH_MOUNT": f"{REPO}:{REPO},{slurm_world.dir}:{slurm_world.dir}"}
    dry_run = slurm_world.dir / "dry-run-trace"
    result, steps = slurm_world.in_allocation(
        "--dry-run", "recipe.py", env=env, command=strace(slurm_world, dry_run.name)
    )
    assert result.returncode == 0, result.stderr
    assert steps == 0
    assert len(host_helpers(dry_run)) == 1, host_helpers(dry_run)
    assert bash_files(dry_run) == {str(REPO / "srun.sh")}
