"""What srun.sh says when a launch on the two-node test SLURM ends badly: the end of the log of the rank that failed
first, where its traceback is; and without a rank failing on its own: a rank that cannot start (no GPU), a step
cancelled from outside, a container that pyxis cannot create. Each is said once, with its cause, and kept in
RUN_DIR."""

import itertools
import os
import random
import shutil
import time

from tests.srun_world import FIXTURES, REPO, SQUASHFS_MAGIC, SrunWorld

pytest_plugins = ["tests.srun_world"]


def console_lines_from_slurm(stderr: str) -> list[str]:
    """Lines of srun's or slurmstepd's own that reached the console instead of RUN_DIR/logs/launcher.log."""
    return [line for line in stderr.splitlines() if line.startswith(("srun: ", "slurmstepd"))]


def test_ranks_without_a_gpu_are_reported_once_with_a_hint_that_can_work(slurm_world: SrunWorld):
    """A job without --gpus-per-node: SLURM gives its steps no CUDA_VISIBLE_DEVICES, and the nodes have no GPU."""
    env = {"SRUNSH_GPUS_PER_NODE": "2"}
    result, steps = slurm_world.in_allocation("--no-container", "recipe.py", salloc=("--nodes=2",), env=env)

    assert (result.returncode, steps) == (2, 1), result.stderr
    said = [line for line in result.stderr.splitlines() if "sees no GPU" in line]
    assert len(said) == 1, result.stderr
    assert said[0] == result.stderr.splitlines()[-1]
    assert said[0].startswith("srun.sh: rank ")
    hint = "sees no GPU (CUDA_VISIBLE_DEVICES=unset): allocate GPUs for the job (salloc --gpus-per-node=2)"
    assert said[0].endswith(hint)
    assert "SRUNSH_GPUS_PER_NODE=0" not in result.stderr
    assert "cannot open" not in result.stderr
    (run_dir,) = slurm_world.run_dirs()
    for rank in range(4):
        log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        assert "sees no GPU" in log and f"rank {rank} " in log
    assert slurm_world.calls() == []


def test_allocation_cancelled_under_the_launch_is_not_reported_as_a_rank_failing(slurm_world: SrunWorld):
    proc, _ = slurm_world.start_in_allocation(
        "--no-container", "recipe.py", env={"SRUNSH_GPUS_PER_NODE": "2", "FAKE_SLEEP": "300"}
    )
    try:
        records = slurm_world.wait_for_ranks(4)
        job, step = records[0]["env"]["SLURM_JOB_ID"], records[0]["env"]["SLURM_STEP_ID"]
        cancelled = slurm_world.cluster.run(["scancel", job])  # the allocation revoked under salloc
        assert cancelled.returncode == 0, cancelled.stderr
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

    assert proc.returncode == 143, stderr
    assert "failed first" not in stderr
    headline = next(line for line in stderr.splitlines() if line.startswith("srun.sh: "))
    assert headline.startswith(f"srun.sh: job step {job}.{step} was stopped from outside srun.sh, no rank failed")
    assert f"*** STEP {job}.{step} ON node1 CANCELLED AT " in stderr
    assert console_lines_from_slurm(stderr) == []
    (run_dir,) = slurm_world.run_dirs()
    assert "CANCELLED AT" in (run_dir / "logs" / "launcher.log").read_text()


def test_container_that_cannot_start_is_reported_once_with_pyxis_cause(slurm_world: SrunWorld):
    image = slurm_world.dir / "image.sqsh"
    image.write_bytes(SQUASHFS_MAGIC + bytes(92))
    env = {
        "SRUNSH_SQSH": str(image),
        "SRUNSH_MOUNT": f"{REPO}:/workspace/megatron,{slurm_world.dir}:{slurm_world.dir}",
        "SRUNSH_GPUS_PER_NODE": "2",
        "PATH": f"{FIXTURES / 'pyxis'}:{slurm_world.env['PATH']}",
        "REAL_SRUN": shutil.which("srun"),
    }
    result, _ = slurm_world.in_allocation("recipe.py", env=env)

    assert result.returncode == 1, result.stderr
    (run_dir,) = slurm_world.run_dirs()
    log = (run_dir / "logs" / "launcher.log").read_text()
    cause = "slurmstepd: error: pyxis:     mkdir: cannot create directory '/raid/enroot/data': No space left on device"
    assert log.count(cause) == 2  # one a node
    lines = result.stderr.splitlines()
    assert f"srun.sh: the launch failed before any rank started; srun said ({run_dir}/logs/launcher.log):" in lines
    assert lines.count("    " + cause) == 1
    assert "    slurmstepd: error: pyxis: failed to create container filesystem for image: " + str(image) in lines
    assert not [line for line in lines if "Exited with exit code" in line]
    assert console_lines_from_slurm(result.stderr) == []
    assert slurm_world.calls() == []


def test_first_failure_report_shows_the_end_of_the_failed_ranks_log_where_its_traceback_is(slurm_world: SrunWorld):
    """Rank 3 writes more lines than the report shows (FAILURE_REPORT_SEED repeats a draw), then dies of a json
    error: Python's own traceback."""
    seed = int(os.environ.get("FAILURE_REPORT_SEED", time.time_ns() % 2**32))
    lines = random.Random(seed).randint(21, 400)
    print(f"FAILURE_REPORT_SEED={seed}: rank 3 writes {lines} lines before its traceback")
    env = {"SRUNSH_GPUS_PER_NODE": "2", "FAKE_FAIL_RANK": "3", "FAKE_FAIL_LINES": str(lines), "FAKE_SLEEP": "300"}
    result, _ = slurm_world.in_allocation("--no-container", "recipe.py", env=env)

    assert result.returncode == 1, result.stderr
    (run_dir,) = slurm_world.run_dirs()
    log = (run_dir / "logs" / "rank-3.log").read_text().splitlines()
    said = result.stderr.splitlines()
    header = f"srun.sh: rank 3 on node2 failed first, with exit status 1; the end of {run_dir}/logs/rank-3.log:"
    after = itertools.takewhile(lambda line: line.startswith("    "), said[said.index(header) + 1 :])
    shown = [line.removeprefix("    ") for line in after]
    assert log[-1].startswith("json.decoder.JSONDecodeError: ") and shown[-1] == log[-1], shown
    assert "Traceback (most recent call last):" in shown and f"log line {lines} of {lines}" in shown
    # Its stdout and its stderr reach the log through a writer each: "started" (stdout) may follow "fails now".
    assert "rank 3 started" not in shown and log.index("rank 3 started") < len(log) - len(shown)
