"""srun.sh --local: GPUS_PER_NODE ranks on this host with SLURM's rank environment, no SLURM involved.

CUDA_VISIBLE_DEVICES stands in for the GPUs, and tests/fixtures/fake_python for python."""

import os
import re
import signal
import time

import pytest

from tests.slurm_cluster import HOSTILE_ARGS, REPO, SrunWorld, pid_gone

pytest_plugins = ["tests.slurm_cluster"]


def wait_gone(pids: list[int], timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(pid_gone(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return False


def test_local_ranks_get_rank_variables_and_a_loopback_master(srun_world: SrunWorld):
    result = srun_world.srun_sh("--local", "recipe.py", env={"GPUS_PER_NODE": "4"})

    assert result.returncode == 0, result.stderr
    records = srun_world.records()
    assert sorted(records) == [0, 1, 2, 3]
    run_ids = {record["env"]["RUN_ID"] for record in records.values()}
    assert len(run_ids) == 1
    assert re.fullmatch(r"local-\d{8}-\d{6}-\d+", run_ids.pop())
    for rank, record in records.items():
        env = record["env"]
        assert (env["RANK"], env["LOCAL_RANK"]) == (str(rank), str(rank))
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("4", "4")
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29500")
        assert record["argv"] == [str(REPO / "entrypoint.py").encode(), b"recipe.py"]


def test_override_with_spaces_quotes_and_newlines_reaches_every_local_rank_unchanged(srun_world: SrunWorld):
    result = srun_world.srun_sh("--local", "recipe.py", *HOSTILE_ARGS, env={"GPUS_PER_NODE": "2"})

    assert result.returncode == 0, result.stderr
    expected = [b"recipe.py", *(arg.encode() for arg in HOSTILE_ARGS)]
    records = srun_world.records()
    assert sorted(records) == [0, 1]
    assert all(record["argv"][1:] == expected for record in records.values())
    assert not os.path.exists("/tmp/srunsh-pwned")


def test_local_rank_count_defaults_to_the_visible_gpus(srun_world: SrunWorld):
    result = srun_world.srun_sh("--local", "recipe.py", env={"CUDA_VISIBLE_DEVICES": "3,5,7"})

    assert result.returncode == 0, result.stderr
    assert sorted(srun_world.records()) == [0, 1, 2]


def test_local_output_is_labelled_with_the_rank_like_srun(srun_world: SrunWorld):
    result = srun_world.srun_sh("--local", "recipe.py", env={"GPUS_PER_NODE": "2"})

    assert result.returncode == 0, result.stderr
    assert {"0: rank 0 started", "1: rank 1 started"} <= set(result.stdout.splitlines())


def test_network_defaults_reach_ranks_but_user_values_win_and_cuda_connections_stay_unset(srun_world: SrunWorld):
    env = {"GPUS_PER_NODE": "1", "NCCL_DEBUG": "INFO", "TRITON_CACHE_DIR": "/tmp/shared-triton"}
    result = srun_world.srun_sh("--local", "recipe.py", env=env)

    assert result.returncode == 0, result.stderr
    rank_env = srun_world.records()[0]["env"]
    assert rank_env["NCCL_DEBUG"] == "INFO"
    assert rank_env["TRITON_CACHE_DIR"] == "/tmp/shared-triton"
    assert rank_env["OMP_NUM_THREADS"] == "1"
    assert rank_env["NCCL_GIN_TYPE"] == "2"
    assert rank_env["DEEP_EP_BACKEND"] == "nccl"
    assert rank_env["TORCH_EXTENSIONS_DIR"] == "/tmp/torch_extensions_0"
    for obsolete in (
        "FI_PROVIDER",
        "FI_EFA_USE_DEVICE_RDMA",
        "FI_EFA_FORK_SAFE",
        "NCCL_BUFFSIZE",
        "NCCL_P2P_NET_CHUNKSIZE",
        "TORCH_DISTRIBUTED_BACKEND",
        "CUDA_DEVICE_MAX_CONNECTIONS",
    ):
        assert obsolete not in rank_env


def test_master_port_knob_reaches_local_ranks(srun_world: SrunWorld):
    result = srun_world.srun_sh("--local", "recipe.py", env={"GPUS_PER_NODE": "1", "MASTER_PORT": "31337"})

    assert result.returncode == 0, result.stderr
    assert srun_world.records()[0]["env"]["MASTER_PORT"] == "31337"


def test_failing_local_rank_stops_the_others_and_srun_sh_exits_nonzero(srun_world: SrunWorld):
    env = {"GPUS_PER_NODE": "4", "FAKE_FAIL_RANK": "2", "FAKE_FAIL_EXIT": "7", "FAKE_SLEEP": "300"}
    started = time.monotonic()
    result = srun_world.srun_sh("--local", "recipe.py", env=env, timeout=90)

    assert time.monotonic() - started < 60
    assert result.returncode == 7
    assert "rank 2 exited with status 7" in result.stderr
    records = srun_world.records()
    assert sorted(records) == [0, 1, 2, 3]
    assert wait_gone([record["pid"] for record in records.values()], timeout=1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_to_local_srun_sh_stops_every_rank(srun_world: SrunWorld, sig: signal.Signals):
    proc = srun_world.start("--local", "recipe.py", env={"GPUS_PER_NODE": "4", "FAKE_SLEEP": "300"})
    try:
        records = srun_world.wait_for_ranks(4)
        proc.send_signal(sig)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

    assert proc.returncode == 128 + sig
    assert wait_gone([record["pid"] for record in records.values()], timeout=1)
