"""srun.sh against a real SLURM (started by the slurm_cluster fixture), run as a user would: salloc, then srun.sh."""

import os
import signal
import subprocess
import time

import pytest

from tests.slurm_cluster import HOSTILE_ARGS, SrunWorld, pid_gone

pytest_plugins = ["tests.slurm_cluster"]

TASKS = 4


def getent_ipv4(host: str) -> str:
    out = subprocess.run(["getent", "ahostsv4", host], capture_output=True, text=True, check=True).stdout
    return out.split()[0]


def test_every_task_gets_rank_variables_and_the_master_ip_from_slurm(slurm_world: SrunWorld):
    result, steps = slurm_world.in_allocation("--no-container", "recipe.py", env={"GPUS_PER_NODE": str(TASKS)})

    assert result.returncode == 0, result.stderr
    assert steps == 1  # exactly one job step: the launch (the pre-flight ran on this host)
    records = slurm_world.records()
    assert sorted(records) == list(range(TASKS))
    job_id = records[0]["env"]["SLURM_JOB_ID"]
    master = getent_ipv4(slurm_world.cluster.node)
    for rank, record in records.items():
        env = record["env"]
        assert env["RANK"] == env["SLURM_PROCID"] == str(rank)
        assert env["LOCAL_RANK"] == env["SLURM_LOCALID"] == str(rank)
        assert env["WORLD_SIZE"] == env["SLURM_NTASKS"] == str(TASKS)
        assert env["LOCAL_WORLD_SIZE"] == str(TASKS)
        assert env["MASTER_ADDR"] == master
        assert env["MASTER_PORT"] == str(20000 + int(job_id) % 20000)
        assert env["RUN_ID"] == job_id
        assert env["TRITON_CACHE_DIR"] == f"/tmp/triton_cache_{rank}"
        assert (env["NCCL_DEBUG"], env["OMP_NUM_THREADS"], env["NCCL_GIN_TYPE"]) == ("WARN", "1", "2")
        assert "CUDA_DEVICE_MAX_CONNECTIONS" not in env
        assert record["cwd"] == str(slurm_world.dir)
    assert {f"{rank}: rank {rank} started" for rank in range(TASKS)} <= set(result.stdout.splitlines())


def test_hostile_overrides_reach_every_slurm_task_byte_for_byte(slurm_world: SrunWorld):
    result, _ = slurm_world.in_allocation("--no-container", "recipe.py", *HOSTILE_ARGS, env={"GPUS_PER_NODE": "2"})

    assert result.returncode == 0, result.stderr
    expected = [b"recipe.py", *(arg.encode() for arg in HOSTILE_ARGS)]
    records = slurm_world.records()
    assert sorted(records) == [0, 1]
    for record in records.values():
        assert record["argv"][0].endswith(b"/entrypoint.py")
        assert record["argv"][1:] == expected
    check = next(call for call in slurm_world.calls() if call["check"])
    assert [bytes.fromhex(a) for a in check["argv_hex"]][4:] == expected  # after entrypoint --check --world-size 2


def test_failing_task_ends_the_step_and_srun_sh_exits_nonzero_within_60s(slurm_world: SrunWorld):
    env = {"GPUS_PER_NODE": str(TASKS), "FAKE_FAIL_RANK": "1", "FAKE_FAIL_EXIT": "7", "FAKE_SLEEP": "300"}
    started = time.monotonic()
    result, steps = slurm_world.in_allocation("--no-container", "recipe.py", env=env, timeout=120)

    assert time.monotonic() - started < 60
    assert result.returncode != 0
    assert steps == 1
    records = slurm_world.records()
    assert sorted(records) == list(range(TASKS))
    assert all(pid_gone(record["pid"]) for record in records.values())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_to_srun_sh_stops_every_slurm_task(slurm_world: SrunWorld, sig: signal.Signals):
    proc, pid_file = slurm_world.start_in_allocation(
        "--no-container", "recipe.py", env={"GPUS_PER_NODE": str(TASKS), "FAKE_SLEEP": "300"}
    )
    try:
        records = slurm_world.wait_for_ranks(TASKS)
        os.kill(int(pid_file.read_text()), sig)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

    assert proc.returncode != 0
    deadline = time.monotonic() + 15
    while not all(pid_gone(r["pid"]) for r in records.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(pid_gone(r["pid"]) for r in records.values())


def test_dry_run_inside_an_allocation_shows_the_job_and_starts_no_step(slurm_world: SrunWorld):
    result, steps = slurm_world.in_allocation(
        "--dry-run", "--no-container", "recipe.py", "a=b c", env={"GPUS_PER_NODE": "2"}
    )

    assert result.returncode == 0, result.stderr
    assert steps == 0
    assert slurm_world.records() == {}
    master = getent_ipv4(slurm_world.cluster.node)
    assert f"export MASTER_ADDR={master}" in result.stdout.splitlines()
    srun_line = next(line for line in result.stdout.splitlines() if line.startswith("srun "))
    assert f"--mpi={slurm_world.env['SRUN_MPI']}" in srun_line
    assert srun_line.endswith("recipe.py a=b\\ c")
