"""srun.sh on the two-node test SLURM, run as a user would: `salloc` or `sbatch` on the login node, then srun.sh.

tests/fixtures/fake_python stands in for each rank; with FAKE_RENDEZVOUS=1 the ranks join torch.distributed (gloo)
from the environment srun.sh gives them and all-reduce RANK+1, so a wrong rank count, master address or port fails
the rendezvous instead of passing unnoticed.
"""

import os
import signal
import time

import pytest

from tests.slurm_cluster import ADDRESSES, GPU_TYPE, NODES
from tests.srun_world import ALLOCATION, HOSTILE_ARGS, REPO, SrunWorld, wait_gone

pytest_plugins = ["tests.srun_world"]

RENDEZVOUS = {"FAKE_RENDEZVOUS": "1"}


def ranks_by_host(records: dict[int, dict]) -> dict[str, list[int]]:
    hosts: dict[str, list[int]] = {}
    for rank, record in sorted(records.items()):
        hosts.setdefault(record["host"], []).append(rank)
    return hosts


def assert_one_job_of(records: dict[int, dict], nodes: list[str], per_node: int) -> None:
    """Ranks 0..N-1 in blocks per node, a consistent rank environment, and a rendezvous that summed every rank."""
    world = len(nodes) * per_node
    assert sorted(records) == list(range(world))
    assert ranks_by_host(records) == {
        node: list(range(i * per_node, (i + 1) * per_node)) for i, node in enumerate(nodes)
    }
    run_ids = {r["env"]["RUN_ID"] for r in records.values()}
    ports = {r["env"]["MASTER_PORT"] for r in records.values()}
    assert len(run_ids) == 1 and len(ports) == 1
    for rank, record in records.items():
        env = record["env"]
        assert (env["RANK"], env["LOCAL_RANK"]) == (str(rank), str(rank % per_node))
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (str(world), str(per_node))
        assert env["MASTER_ADDR"] == ADDRESSES[nodes[0]]
        assert env.get("OMP_NUM_THREADS") == ("1" if per_node > 1 else None)  # torchrun's rule
        if "rendezvous" in record:
            assert record["rendezvous"] == {"rank": rank, "world_size": world, "sum": world * (world + 1) // 2}


def test_two_nodes_rendezvous_with_ranks_per_node_from_the_gpus_allocated(slurm_world: SrunWorld):
    every_rank = {"SRUNSH_CONSOLE_RANKS": "all"}  # every rank's lines on the console, as each rank's log has them
    result, steps = slurm_world.in_allocation(
        "--no-container", "recipe.py", salloc=("--nodes=2", "--gpus-per-node=3"), env={**RENDEZVOUS, **every_rank}
    )

    assert result.returncode == 0, result.stderr
    assert steps == 1
    records = slurm_world.records()
    assert_one_job_of(records, list(NODES), per_node=3)
    assert all("rendezvous" in r for r in records.values())
    run_id = records[0]["env"]["RUN_ID"]
    assert run_id.startswith(records[0]["env"]["SLURM_JOB_ID"] + "-")
    assert records[0]["env"]["RUN_DIR"] == str(slurm_world.dir / "outputs" / "recipe" / run_id)
    for rank in records:
        log = slurm_world.dir / "outputs" / "recipe" / run_id / "logs" / f"rank-{rank}.log"
        assert log.read_text() == f"rank {rank} started\n"
        assert f"{rank}: rank {rank} started" in result.stdout.splitlines()


def test_typed_gpus_of_the_allocation_give_four_ranks_a_node(slurm_world: SrunWorld):
    """The nodes' GPUs are typed (Gres=gpu:h100:4), and so is the request: SLURM_GPUS_PER_NODE=h100:4."""
    result, steps = slurm_world.in_allocation(
        "--no-container", "recipe.py", salloc=("--nodes=2", f"--gpus-per-node={GPU_TYPE}:4")
    )

    assert result.returncode == 0, result.stderr
    assert steps == 1
    records = slurm_world.records()
    assert_one_job_of(records, list(NODES), per_node=4)
    assert {r["env"]["SLURM_GPUS_PER_NODE"] for r in records.values()} == {f"{GPU_TYPE}:4"}


def test_typed_gres_of_the_allocation_gives_four_ranks_a_node(slurm_world: SrunWorld):
    """salloc --gres=gpu:h100:4 leaves its shell no GPU variable: srun.sh reads the job's request from SLURM."""
    result, steps = slurm_world.in_allocation(
        "--no-container", "recipe.py", salloc=("--nodes=2", f"--gres=gpu:{GPU_TYPE}:4")
    )

    assert result.returncode == 0, result.stderr
    assert steps == 1
    assert_one_job_of(slurm_world.records(), list(NODES), per_node=4)


def test_a_node_with_one_rank_leaves_its_cpu_threads_to_torch(slurm_world: SrunWorld):
    result, _ = slurm_world.in_allocation(
        "--no-container", "recipe.py", salloc=("--nodes=2", "--gpus-per-node=1"), env=RENDEZVOUS
    )

    assert result.returncode == 0, result.stderr
    assert_one_job_of(slurm_world.records(), list(NODES), per_node=1)


def test_sbatch_on_two_nodes_uses_the_first_nodes_address_not_its_loopback_name(slurm_world: SrunWorld):
    """Under sbatch srun.sh runs on node1, whose own name resolves to 127.0.1.1 there (Debian's /etc/hosts)."""
    resolved_on_node1 = slurm_world.cluster.run(["getent", "ahostsv4", "node1"], host="node1").stdout.split()[0]
    assert resolved_on_node1 == "127.0.1.1"
    script = slurm_world.dir / "job.sh"
    script.write_text(f"#!/bin/bash\nSRUNSH_GPUS_PER_NODE=2 exec {REPO}/srun.sh --no-container recipe.py\n")
    result = slurm_world.on_login_node(
        ["sbatch", "--wait", *ALLOCATION, "--output=job.out", str(script)], env=RENDEZVOUS, timeout=120
    )

    assert result.returncode == 0, (slurm_world.dir / "job.out").read_text()
    assert_one_job_of(slurm_world.records(), list(NODES), per_node=2)


def test_hostile_overrides_reach_every_rank_of_both_nodes_byte_for_byte(slurm_world: SrunWorld):
    result, _ = slurm_world.in_allocation(
        "--no-container", "recipe.py", *HOSTILE_ARGS, env={"SRUNSH_GPUS_PER_NODE": "2"}
    )

    assert result.returncode == 0, result.stderr
    expected = [b"recipe.py", *(arg.encode() for arg in HOSTILE_ARGS)]
    records = slurm_world.records()
    assert ranks_by_host(records) == {"node1": [0, 1], "node2": [2, 3]}
    for record in records.values():
        assert record["argv"][0] == str(REPO / "entrypoint.py").encode()
        assert record["argv"][1:] == expected
    assert not os.path.exists("/tmp/srunsh-pwned")


@pytest.mark.parametrize(
    "allocation",
    [
        ("--nodes=1", "--ntasks=1", "--gpus-per-node=4"),
        ("--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=4"),
        ("--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=4"),
    ],
    ids=["-n1", "--ntasks-per-node=2", "two nodes, --ntasks-per-node=1"],
)
def test_task_count_of_the_allocation_does_not_shrink_the_job(slurm_world: SrunWorld, allocation: tuple[str, ...]):
    result, _ = slurm_world.in_allocation(
        "--no-container", "recipe.py", salloc=allocation, env={"SRUNSH_GPUS_PER_NODE": "4", **RENDEZVOUS}
    )

    assert result.returncode == 0, result.stderr
    nodes = int(allocation[0].split("=")[1])
    assert_one_job_of(slurm_world.records(), list(NODES[:nodes]), per_node=4)


def test_sbatch_with_a_torchrun_style_header_starts_every_rank(slurm_world: SrunWorld):
    script = slurm_world.dir / "job.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=4\n"
        f"SRUNSH_GPUS_PER_NODE=3 exec {REPO}/srun.sh --no-container recipe.py\n"
    )
    result = slurm_world.on_login_node(["sbatch", "--wait", "--output=job.out", str(script)], env=RENDEZVOUS)

    assert result.returncode == 0, (slurm_world.dir / "job.out").read_text()
    assert_one_job_of(slurm_world.records(), list(NODES), per_node=3)


def test_launch_from_inside_a_job_step_starts_the_whole_job(slurm_world: SrunWorld):
    result, _ = slurm_world.in_allocation(
        "--no-container",
        "recipe.py",
        command=("srun", "--nodes=1", "--ntasks=1"),
        env={"SRUNSH_GPUS_PER_NODE": "2", **RENDEZVOUS},
        timeout=120,
    )

    assert result.returncode == 0, result.stderr
    assert_one_job_of(slurm_world.records(), list(NODES), per_node=2)


def test_two_launches_in_one_allocation_are_two_runs(slurm_world: SrunWorld):
    script = slurm_world.dir / "twice.sh"
    script.write_text(
        f"#!/bin/bash\nset -e\n{REPO}/srun.sh --no-container recipe.py first=1\n"
        f"{REPO}/srun.sh --no-container recipe.py second=2\n"
    )
    script.chmod(0o755)
    result = slurm_world.on_login_node(["salloc", "--quiet", "--nodes=1", "--gpus-per-node=1", str(script)])

    assert result.returncode == 0, result.stderr
    calls = slurm_world.calls()[-2:]
    assert [bytes.fromhex(c["argv_hex"][-1]) for c in calls] == [b"first=1", b"second=2"]
    run_ids = [c["run_id"] for c in calls]
    assert run_ids[0] != run_ids[1]
    run_dirs = slurm_world.run_dirs()
    assert [d.name for d in run_dirs if d.name in run_ids] == sorted(run_ids)
    ports = {line for line in result.stderr.splitlines() if "master " in line}
    assert len(ports) == 2


def test_rank_failing_on_node2_stops_both_nodes_and_srun_sh_exits_with_its_status(slurm_world: SrunWorld):
    env = {"SRUNSH_GPUS_PER_NODE": "2", "FAKE_FAIL_RANK": "3", "FAKE_FAIL_EXIT": "3", "FAKE_SLEEP": "300"}
    started = time.monotonic()
    result, steps = slurm_world.in_allocation("--no-container", "recipe.py", env=env)

    assert time.monotonic() - started < 60
    assert result.returncode == 3, result.stderr
    assert steps == 1
    records = slurm_world.records()
    assert ranks_by_host(records) == {"node1": [0, 1], "node2": [2, 3]}
    assert all(pid_gone_eventually(r["pid"]) for r in records.values())
    report = [line for line in result.stderr.splitlines() if line.startswith("srun.sh: rank")]
    assert report == [
        f"srun.sh: rank 3 on node2 failed first, with exit status 3; the end of"
        f" {slurm_world.run_dirs()[0]}/logs/rank-3.log:"
    ]
    assert "    rank 3 fails now" in result.stderr.splitlines()
    assert not [line for line in result.stderr.splitlines() if "Exited with exit code" in line]
    assert slurm_world.signals_seen() == {0: ["SIGTERM"], 1: ["SIGTERM"], 2: ["SIGTERM"]}


def test_a_failed_rank_that_left_a_process_running_on_node2_still_ends_the_launch(slurm_world: SrunWorld):
    """A process that outlived its rank held the rank's output: srun never saw the task end, and every other rank
    waited for ever. Rank 3 leaves one that ignores SIGTERM (as a writer blocked in a kernel call does) and fails."""
    env = {"SRUNSH_GPUS_PER_NODE": "2", "FAKE_FAIL_RANK": "3", "FAKE_FAIL_EXIT": "3", "FAKE_SLEEP": "300"}
    env |= {"FAKE_LEAVE_CHILD": "3", "FAKE_LEFT_IGNORES_TERM": "1"}
    started = time.monotonic()
    result, _ = slurm_world.in_allocation("--no-container", "recipe.py", env=env)

    assert time.monotonic() - started < 60
    assert result.returncode == 3, result.stderr
    records = slurm_world.records()
    assert pid_gone_eventually(records[3]["left_pid"])
    assert all(pid_gone_eventually(r["pid"]) for r in records.values())
    assert (
        "srun.sh: rank 3 ended and left 1 process(es) running"
        in (slurm_world.run_dirs()[0] / "logs" / "rank-3.log").read_text()
    )


def pid_gone_eventually(pid: int) -> bool:
    return wait_gone([pid], timeout=10)


# SIGHUP: a closed terminal, a dropped ssh.
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_signal_to_srun_sh_gives_every_rank_on_both_nodes_sigterm(slurm_world: SrunWorld, sig: signal.Signals):
    proc, pid_file = slurm_world.start_in_allocation(
        "--no-container", "recipe.py", env={"SRUNSH_GPUS_PER_NODE": "2", "FAKE_SLEEP": "300"}
    )
    try:
        records = slurm_world.wait_for_ranks(4)
        os.kill(int(pid_file.read_text()), sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

    assert proc.returncode == 128 + sig, stderr
    assert f"srun.sh: got {sig.name}; sending SIGTERM to every rank" in stderr.splitlines()
    assert wait_gone([r["pid"] for r in records.values()])
    assert slurm_world.signals_seen() == {rank: ["SIGTERM"] for rank in range(4)}


def test_ctrl_c_to_salloc_gives_every_rank_sigterm_before_any_sigkill(slurm_world: SrunWorld):
    proc, _ = slurm_world.start_in_allocation(
        "--no-container", "recipe.py", env={"SRUNSH_GPUS_PER_NODE": "2", "FAKE_SLEEP": "300"}
    )
    try:
        records = slurm_world.wait_for_ranks(4)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal does on Ctrl-C
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

    assert wait_gone([r["pid"] for r in records.values()])
    assert slurm_world.signals_seen() == {rank: ["SIGTERM"] for rank in range(4)}


def test_dry_run_inside_an_allocation_shows_the_job_and_starts_no_step(slurm_world: SrunWorld):
    result, steps = slurm_world.in_allocation(
        "--dry-run", "--no-container", "recipe.py", "a=b c", salloc=("--nodes=2", "--gpus-per-node=2")
    )

    assert result.returncode == 0, result.stderr
    assert steps == 0
    assert slurm_world.records() == {}
    lines = result.stdout.splitlines()
    assert f"export MASTER_ADDR={ADDRESSES['node1']}" in lines
    assert "export WORLD_SIZE=4" in lines
    srun_line = next(line for line in lines if line.startswith("srun "))
    assert srun_line.startswith("srun --nodes=2 --ntasks=4 --ntasks-per-node=2 --cpus-per-task=4 --distribution=block")
    assert " --mpi=none " in srun_line
    assert srun_line.endswith("recipe.py 'a=b c'")


def test_launches_started_together_in_one_allocation_get_runs_and_ports_of_their_own(slurm_world: SrunWorld):
    """The race of SRUNSH_RUN_ID: four srun.sh started at once, three times over, in one allocation."""
    script = slurm_world.dir / "together.sh"
    script.write_text(
        "#!/bin/bash\nfor round in 1 2 3; do\n  for i in 1 2 3 4; do\n"
        f"    {REPO}/srun.sh --no-container recipe.py launch=$round.$i &\n"
        "  done\n  wait\n  echo round $round done >&2\ndone\n"
    )
    script.chmod(0o755)
    result = slurm_world.on_login_node(
        ["salloc", "--quiet", "--nodes=1", "--gpus-per-node=4", str(script)],
        env={"SRUNSH_GPUS_PER_NODE": "1"},
        timeout=180,
    )

    assert result.returncode == 0, result.stderr
    starts = [line.split(", ") for line in result.stderr.splitlines() if line.startswith("# srun.sh: 1 node(s)")]
    assert len(starts) == 12, result.stderr
    run_ids = [fields[1].split()[2] for fields in starts]
    assert len(set(run_ids)) == 12
    rounds = result.stderr.split("done\n")[:3]
    for text in rounds:
        ports = [line.split("master ")[1].split(";")[0] for line in text.splitlines() if "master " in line]
        assert len(ports) == 4 and len(set(ports)) == 4, text
    launches = {bytes.fromhex(c["argv_hex"][-1]).decode(): c["run_id"] for c in slurm_world.calls()}
    assert len(launches) == 12 and len(set(launches.values())) == 12
    for run_id in run_ids:
        assert (slurm_world.dir / "outputs" / "recipe" / run_id / "logs" / "rank-0.log").read_text() == (
            "rank 0 started\n"
        )
