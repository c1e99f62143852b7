"""srun.sh --local: SRUNSH_GPUS_PER_NODE ranks on this host with the rank environment SLURM would give, no SLURM.

CUDA_VISIBLE_DEVICES stands in for the GPUs, and tests/fixtures/fake_python for python."""

import os
import re
import shlex
import signal
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.srun_world import HOSTILE_ARGS, REPO, SrunWorld, wait_gone

pytest_plugins = ["tests.srun_world"]


def test_local_ranks_get_rank_variables_a_loopback_master_and_a_run_of_their_own(srun_world: SrunWorld):
    result = srun_world.srun_sh("--local", "recipe.py", env={"SRUNSH_GPUS_PER_NODE": "4", "FAKE_RENDEZVOUS": "1"})

    assert result.returncode == 0, result.stderr
    records = srun_world.records()
    assert sorted(records) == [0, 1, 2, 3]
    (run_dir,) = srun_world.run_dirs()
    assert re.fullmatch(r"local-\d{8}-\d{6}-\d+", run_dir.name)
    ports = {record["env"]["MASTER_PORT"] for record in records.values()}
    assert len(ports) == 1 and 20000 <= int(ports.pop()) < 32768
    for rank, record in records.items():
        env = record["env"]
        assert (env["RANK"], env["LOCAL_RANK"]) == (str(rank), str(rank))
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("4", "4")
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert (env["RUN_ID"], env["RUN_DIR"]) == (run_dir.name, str(run_dir))
        assert record["argv"] == [str(REPO / "entrypoint.py").encode(), b"recipe.py"]
        assert record["rendezvous"] == {"rank": rank, "world_size": 4, "sum": 10}


def test_override_with_spaces_quotes_and_newlines_reaches_every_local_rank_unchanged(srun_world: SrunWorld):
    result = srun_world.srun_sh("--local", "recipe.py", *HOSTILE_ARGS, env={"SRUNSH_GPUS_PER_NODE": "2"})

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


def test_each_rank_has_a_log_of_its_own_and_labelled_console_lines(srun_world: SrunWorld):
    result = srun_world.srun_sh("--local", "recipe.py", env={"SRUNSH_GPUS_PER_NODE": "2"})

    assert result.returncode == 0, result.stderr
    assert {"0: rank 0 started", "1: rank 1 started"} <= set(result.stdout.splitlines())
    (run_dir,) = srun_world.run_dirs()
    for rank in (0, 1):
        assert (run_dir / "logs" / f"rank-{rank}.log").read_text() == f"rank {rank} started\n"
    assert oct(run_dir.stat().st_mode & 0o777) == "0o700"


def test_a_line_written_in_two_parts_stays_whole_in_the_rank_log(srun_world: SrunWorld):
    """An unbuffered python writes a line's text and its newline apart; a stderr line in between must not splice."""
    rank = srun_world.dir / "rank-writing-in-parts"
    torchrun = f'[ "$1" = -m ] && exec {shlex.quote(sys.executable)} "$@"'  # torchrun is this interpreter's
    rank.write_text(f"#!/bin/sh\n{torchrun}\nprintf half; sleep 0.5; echo 'err line' >&2; sleep 0.5; echo ' done'\n")
    rank.chmod(0o755)
    result = srun_world.srun_sh("--local", "recipe.py", env={"SRUNSH_GPUS_PER_NODE": "1", "SRUNSH_PYTHON": str(rank)})

    assert result.returncode == 0, result.stderr
    (run_dir,) = srun_world.run_dirs()
    assert (run_dir / "logs" / "rank-0.log").read_text() == "err line\nhalf done\n"
    assert "0: half done" in result.stdout.splitlines()
    assert "0: err line" in result.stderr.splitlines()


def test_network_defaults_reach_ranks_but_user_values_win_and_cuda_connections_stay_unset(srun_world: SrunWorld):
    env = {"SRUNSH_GPUS_PER_NODE": "1", "NCCL_DEBUG": "INFO", "TRITON_CACHE_DIR": "/tmp/shared-triton"}
    result = srun_world.srun_sh("--local", "recipe.py", env=env)

    assert result.returncode == 0, result.stderr
    rank_env = srun_world.records()[0]["env"]
    assert rank_env["NCCL_DEBUG"] == "INFO"
    assert rank_env["TRITON_CACHE_DIR"] == "/tmp/shared-triton"
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
        "GLOO_SOCKET_IFNAME",
    ):
        assert obsolete not in rank_env


@pytest.mark.parametrize(
    ("gpus", "user", "seen"), [("1", None, None), ("2", None, "1"), ("1", "6", "6"), ("2", "6", "6"), ("2", "", "")]
)
def test_cpu_threads_are_one_a_rank_where_ranks_share_the_host_and_torchs_own_for_a_lone_rank(
    srun_world: SrunWorld, gpus: str, user: str | None, seen: str | None
):
    """torchrun's rule (a value the user set wins): one thread each where ranks share a node; a node's only rank
    keeps torch's default, every CPU it may use."""
    env = {"SRUNSH_GPUS_PER_NODE": gpus, **({} if user is None else {"OMP_NUM_THREADS": user})}
    result = srun_world.srun_sh("--local", "recipe.py", env=env)

    assert result.returncode == 0, result.stderr
    records = srun_world.records()
    assert len(records) == int(gpus)
    assert {record["env"].get("OMP_NUM_THREADS") for record in records.values()} == {seen}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gpus=st.integers(1, 3), user=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")))
def test_any_cpu_thread_count_the_user_exported_reaches_every_rank_unchanged(
    srun_world: SrunWorld, gpus: int, user: str
):
    for earlier in srun_world.records_dir.glob("rank-*.json"):  # hypothesis's earlier examples share this world
        earlier.unlink()
    result = srun_world.srun_sh(
        "--local", "recipe.py", env={"SRUNSH_GPUS_PER_NODE": str(gpus), "OMP_NUM_THREADS": user}
    )

    assert result.returncode == 0, result.stderr
    records = srun_world.records()
    assert {rank: record["env"].get("OMP_NUM_THREADS") for rank, record in records.items()} == dict.fromkeys(
        range(gpus), user
    )


def test_master_port_and_run_id_knobs_reach_local_ranks(srun_world: SrunWorld):
    env = {"SRUNSH_GPUS_PER_NODE": "1", "MASTER_PORT": "31337", "SRUNSH_RUN_ID": "my-run.1"}
    result = srun_world.srun_sh("--local", "recipe.py", env=env)

    assert result.returncode == 0, result.stderr
    rank_env = srun_world.records()[0]["env"]
    assert (rank_env["MASTER_PORT"], rank_env["RUN_ID"]) == ("31337", "my-run.1")
    assert rank_env["RUN_DIR"] == str(srun_world.dir / "outputs" / "recipe" / "my-run.1")
    assert "new run my-run.1" in result.stderr


def test_an_earlier_run_id_resumes_that_run(srun_world: SrunWorld):
    first = srun_world.srun_sh("--local", "recipe.py", env={"SRUNSH_GPUS_PER_NODE": "1"})
    assert first.returncode == 0, first.stderr
    (run_dir,) = srun_world.run_dirs()

    again = srun_world.srun_sh("--local", "recipe.py", env={"SRUNSH_GPUS_PER_NODE": "1", "SRUNSH_RUN_ID": run_dir.name})

    assert again.returncode == 0, again.stderr
    assert f"resuming run {run_dir.name}" in again.stderr
    assert srun_world.run_dirs() == [run_dir]
    assert (run_dir / "logs" / "rank-0.log").read_text() == "rank 0 started\n" * 2


def test_two_local_launches_are_two_runs_with_two_ports(srun_world: SrunWorld):
    first = srun_world.start("--local", "recipe.py", env={"SRUNSH_GPUS_PER_NODE": "1", "FAKE_SLEEP": "3"})
    second = srun_world.srun_sh("--local", "recipe.py", env={"SRUNSH_GPUS_PER_NODE": "1"})
    first.communicate(timeout=60)

    assert (first.returncode, second.returncode) == (0, 0), second.stderr
    assert len(srun_world.run_dirs()) == 2
    assert len({call["run_id"] for call in srun_world.calls()}) == 2


def test_failing_local_rank_stops_the_others_and_srun_sh_exits_with_its_status(srun_world: SrunWorld):
    env = {"SRUNSH_GPUS_PER_NODE": "4", "FAKE_FAIL_RANK": "2", "FAKE_FAIL_EXIT": "7", "FAKE_SLEEP": "300"}
    result = srun_world.srun_sh("--local", "recipe.py", env=env, timeout=90)

    assert result.returncode == 7
    host = os.uname().nodename
    assert f"srun.sh: rank 2 on {host} failed first, with exit status 7; the end of" in result.stderr
    assert "    rank 2 fails now" in result.stderr.splitlines()
    records = srun_world.records()
    assert sorted(records) == [0, 1, 2, 3]
    assert wait_gone([record["pid"] for record in records.values()], timeout=1)
    assert srun_world.signals_seen() == {0: ["SIGTERM"], 1: ["SIGTERM"], 3: ["SIGTERM"]}
    # torchrun's own failure report goes to the run's launcher.log, not between srun.sh's lines.
    assert "ChildFailedError" not in result.stderr
    (run_dir,) = srun_world.run_dirs()
    assert "ChildFailedError" in (run_dir / "logs" / "launcher.log").read_text()


@pytest.mark.parametrize("ignores_term", ["0", "1"], ids=["dies-of-sigterm", "ignores-sigterm"])
def test_a_process_a_rank_leaves_running_is_stopped_and_the_launch_ends(srun_world: SrunWorld, ignores_term: str):
    """Issue 67's hang: a process that outlived its rank (an asynchronous checkpoint writer) held the rank's output
    pipe, so its log writers, its rank.sh and the launch waited for ever. Rank 1 leaves one; rank 0 is healthy."""
    env = {"SRUNSH_GPUS_PER_NODE": "2", "FAKE_LEAVE_CHILD": "1", "FAKE_LEFT_IGNORES_TERM": ignores_term}
    result = srun_world.srun_sh("--local", "recipe.py", env={**env, "FAKE_SLEEP": "2"}, timeout=60)

    assert result.returncode == 0, result.stderr
    records = srun_world.records()
    assert wait_gone([records[1]["left_pid"]], timeout=1)
    assert srun_world.signals_seen() == {}
    (run_dir,) = srun_world.run_dirs()
    said = f"srun.sh: rank 1 ended and left 1 process(es) running, stopped now: [{records[1]['left_pid']}] "
    assert said in (run_dir / "logs" / "rank-1.log").read_text()
    assert "left" not in (run_dir / "logs" / "rank-0.log").read_text()
    assert "rank 1 started" in (run_dir / "logs" / "rank-1.log").read_text()


def test_a_killed_rank_that_leaves_a_spawned_worker_and_a_forked_manager_still_ends_the_launch(srun_world: SrunWorld):
    """What a SIGKILLed rank's persistent asynchronous checkpoint writer leaves, made by Python's own multiprocessing
    (a spawned daemon worker, a forked manager, and whatever else multiprocessing starts for them)."""
    env = {"SRUNSH_GPUS_PER_NODE": "2", "FAKE_DIE_LEAVING_MP": "0", "FAKE_SLEEP": "300"}
    result = srun_world.srun_sh("--local", "recipe.py", env=env, timeout=60)

    assert result.returncode == 128 + signal.SIGKILL, result.stderr
    left = srun_world.records()[0]["left_pids"]
    assert wait_gone(left, timeout=5), left
    (run_dir,) = srun_world.run_dirs()
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "srun.sh: rank 0 ended and left" in log and all(f"[{pid}]" in log for pid in left), log


def test_python_that_cannot_run_torchrun_is_reported_with_the_end_of_the_launcher_log(srun_world: SrunWorld):
    no_torch = srun_world.dir / "python-without-torch"
    no_torch.write_text('#!/bin/sh\necho "No module named torch ($*)" >&2\nexit 1\n')
    no_torch.chmod(0o755)
    result = srun_world.srun_sh(
        "--local", "recipe.py", env={"SRUNSH_GPUS_PER_NODE": "2", "SRUNSH_PYTHON": str(no_torch)}
    )

    assert result.returncode == 1
    (run_dir,) = srun_world.run_dirs()
    *_, header, last = result.stderr.splitlines()
    assert header == f"srun.sh: the launch failed before any rank started; torchrun said ({run_dir}/logs/launcher.log):"
    assert last.startswith("    No module named torch (-m torch.distributed.run ")
    assert srun_world.calls() == []


# SIGHUP: a closed terminal, a dropped ssh.
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_signal_to_local_srun_sh_gives_every_rank_sigterm(srun_world: SrunWorld, sig: signal.Signals):
    proc = srun_world.start("--local", "recipe.py", env={"SRUNSH_GPUS_PER_NODE": "4", "FAKE_SLEEP": "300"})
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
    assert srun_world.signals_seen() == {rank: ["SIGTERM"] for rank in range(4)}


def test_a_run_id_that_is_still_running_is_refused_and_the_live_run_is_untouched(srun_world: SrunWorld):
    env = {"SRUNSH_GPUS_PER_NODE": "1", "SRUNSH_RUN_ID": "live", "FAKE_SLEEP": "300"}
    first = srun_world.start("--local", "recipe.py", env=env)
    try:
        srun_world.wait_for_ranks(1)
        second = srun_world.srun_sh("--local", "recipe.py", env={**env, "FAKE_SLEEP": "0"})
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)

    assert second.returncode == 2
    (line,) = second.stderr.splitlines()
    assert line.startswith("srun.sh: run live is still running (srun.sh pid ")
    assert line.endswith(": wait for it to end, or leave SRUNSH_RUN_ID unset for a new run")
    assert len(srun_world.calls()) == 1
    (run_dir,) = srun_world.run_dirs()
    assert (run_dir / "logs" / "rank-0.log").read_text() == "rank 0 started\n"


def test_rank_logs_and_status_records_are_readable_by_their_owner_only(srun_world: SrunWorld):
    result = srun_world.srun_sh("--local", "recipe.py", env={"SRUNSH_GPUS_PER_NODE": "2", "FAKE_FAIL_RANK": "1"})

    assert result.returncode == 1
    (run_dir,) = srun_world.run_dirs()
    modes = {path.name: path.stat().st_mode & 0o777 for path in (run_dir / "logs").iterdir()}
    assert {"rank-0.log", "rank-1.log", "rank-1.status", "launcher.log"} <= modes.keys()
    assert set(modes.values()) == {0o600}, modes
    assert (run_dir.stat().st_mode & 0o777, (run_dir / "logs").stat().st_mode & 0o777) == (0o700, 0o700)
