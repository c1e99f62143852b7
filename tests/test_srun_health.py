"""srun.sh --health and SRUNSH_HEALTH=1 on the two-node test SLURM, run as a user would.

Every rank runs the real launcher/health.py (tests/fixtures/fake_python hands it to this interpreter) over gloo on the
CPU, so the GPU figures do not apply; launcher/health/report.py supervises the step and prints the table. A test makes
one rank slow (FAKE_HEALTH_SLOW: its collectives start late) or stuck (FAKE_HEALTH_HANG: its broadcast among its
node's ranks never returns); those faults live in the stand-in only.

The test cluster's two nodes share this machine's CPUs, so what one node's ranks measure among themselves depends on
what the other node's do at the time: the healthy job runs one rank a node (the pair and job-wide collectives, which
every rank measures together), and a slow rank is slower by far more than that noise.

The three-node cluster (tests.slurm_cluster's slurm_cluster_three) has real link faults: tc's token-bucket filter caps
node3's link. There the pair rounds leave a node that looks slow, by noise or by its cap, and the check retests it;
bench/results/health-noise.md has how often noise fooled it (20+ runs, not here).
"""

import json
import re
import statistics
import time
from pathlib import Path

import pytest

from tests.slurm_cluster import SlurmCluster, capped_link, slurm_cluster_three  # noqa: F401 (a fixture)
from tests.srun_world import SRUN_SH, SrunWorld, _world_on

pytest_plugins = ["tests.srun_world"]

TWO_BY_TWO = {"SRUNSH_GPUS_PER_NODE": "2"}
PARTS = ["start", "gpu", "pair.0.all_reduce", "pair.0.broadcast", "job.all_reduce", "job.broadcast"]
THREE_NODES = ("--nodes=3", "--gpus-per-node=4")
ONE_RANK = {"SRUNSH_GPUS_PER_NODE": "1"}
CAP_GB_S = 500e6 / 8 / 1e9  # tbf at 500 Mbit/s


@pytest.fixture
def slurm_world_three(tmp_path, slurm_cluster_three: SlurmCluster):  # noqa: F811
    yield from _world_on(tmp_path, slurm_cluster_three)


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "health.json").read_text())


def only_run_dir(world: SrunWorld, recipe: str = "health") -> Path:
    (run_dir,) = (world.dir / "outputs" / recipe).glob("*/")
    return run_dir


def table_rows(stdout: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in stdout.splitlines() if re.match(r"node\d ", line)}


def test_health_check_passes_on_a_healthy_two_node_job_and_prints_its_table(slurm_world: SrunWorld):
    result, steps = slurm_world.in_allocation("--no-container", "--health", env={"SRUNSH_GPUS_PER_NODE": "1"})

    assert result.returncode == 0, result.stdout + result.stderr
    assert steps == 1
    header = next(line for line in result.stdout.splitlines() if line.startswith("node "))
    assert header.split() == [
        *("node", "ranks", "GPUs", "free", "GiB", "matmul", "TF/s", "HBM", "TB/s"),
        *("node", "AR", "node", "BC", "pair", "AR", "pair", "BC", "verdict"),
    ]
    rows = table_rows(result.stdout)
    assert [rows["node1"][1], rows["node2"][1]] == ["0", "1"]
    assert rows["node1"][-1] == rows["node2"][-1] == "OK"
    assert rows["node1"][2:8] == ["n/a"] * 6  # no GPU (gloo on the CPU), and one rank a node
    assert "srun.sh: health check passed on all 2 node(s)" in result.stdout
    report = results(only_run_dir(slurm_world))
    assert report["passed"] and report["failed_nodes"] == [] and report["outcome"] == "finished"
    for node in report["nodes"]:
        assert node["figures"]["pair.all_reduce"] > 0 and node["figures"]["pair.broadcast"] > 0
    assert report["job"]["all_reduce"] > 0 and report["job"]["broadcast"] > 0
    for rank, record in report["ranks"].items():
        assert list(record["results"]) == PARTS, rank
        assert record["results"]["pair.0.all_reduce"]["partner"] == ("node2" if rank == "0" else "node1")
    assert {call.get("health_check", "").rsplit("/", 2)[-2:][0] for call in slurm_world.calls()} == {"launcher"}
    print(f"\n[health] 2 nodes x 1 rank, gloo: {report['seconds']} s; parts (rank 0):", {
        part: result["seconds"] for part, result in report["ranks"]["0"]["results"].items()
    })  # fmt: skip


def test_slow_rank_is_named_with_its_node_and_the_fix(slurm_world: SrunWorld):
    env = {**TWO_BY_TWO, "FAKE_HEALTH_SLOW": "3", "FAKE_HEALTH_DELAY_S": "0.05"}
    result, _ = slurm_world.in_allocation("--no-container", "--health", env=env)

    assert result.returncode == 1, result.stdout + result.stderr
    rows = table_rows(result.stdout)
    assert (rows["node1"][-1], rows["node2"][-1]) == ("OK", "SLOW")
    named = [line for line in result.stdout.splitlines() if line.startswith("srun.sh: node2: node all-reduce")]
    assert named and "below the median" in named[0] and named[0].endswith(": exclude it: --exclude=node2")
    assert "health check failed on 1 of 2 node(s): node2 (salloc/sbatch --exclude=node2)" in result.stdout
    assert results(only_run_dir(slurm_world))["failed_nodes"] == ["node2"]


# The deadline of each part when a test hangs one: the start's (3 x as long) must hold a healthy start, whose torch
# import and rendezvous took more than 12 s on 2 cores at load 13 (a 4 s deadline condemned every node).
HANG_DEADLINE_S = 8
NODE2_HUNG = (
    f"srun.sh: node2: node broadcast did not finish within {HANG_DEADLINE_S} s (ranks 2-3): exclude it: --exclude=node2"
)


def test_rank_hung_in_a_collective_is_named_with_its_node_within_the_deadline(slurm_world: SrunWorld):
    env = {**TWO_BY_TWO, "FAKE_HEALTH_HANG": "3", "SRUNSH_HEALTH_TIMEOUT_S": str(HANG_DEADLINE_S)}
    result, _ = slurm_world.in_allocation("--no-container", "--health", env=env)
    ended = time.time()

    assert result.returncode == 1, result.stdout + result.stderr
    rows = table_rows(result.stdout)
    assert (rows["node1"][-1], rows["node2"][-1]) == ("BLOCKED", "HANG")
    assert NODE2_HUNG in result.stdout.splitlines()
    report = results(only_run_dir(slurm_world))
    assert report["failed_nodes"] == ["node2"] and report["outcome"] == "deadline"
    hung_since = report["ranks"]["3"]["since"]
    assert report["ranks"]["3"]["part"] == "node.broadcast"
    assert ended - hung_since < HANG_DEADLINE_S + 15, "named long after the deadline"


def wait_for_batch_job(world: SrunWorld, *launch: str, env: dict[str, str]) -> tuple[str, str]:
    """`srun.sh --sbatch LAUNCH` on the login node, until the job ended; its id and its log."""
    submitted = world.on_login_node([str(SRUN_SH), "--sbatch", *launch], env=env)
    assert submitted.returncode == 0, submitted.stderr
    job = re.search(r"batch job (\d+)", submitted.stdout).group(1)
    deadline = time.monotonic() + 240
    while world.cluster.job_listed(job):
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(1)
    return job, (world.dir / "outputs" / "recipe" / f"slurm-{job}.out").read_text()


def test_batch_job_with_health_requeues_itself_without_the_failing_node(slurm_world: SrunWorld):
    env = {"SRUNSH_HEALTH": "1", "SRUNSH_HEALTH_TIMEOUT_S": str(HANG_DEADLINE_S), "FAKE_HEALTH_HANG": "node2"}
    env["SRUNSH_MAX_RETRIES"] = "1"
    job, log = wait_for_batch_job(
        slurm_world, "--nodes=1-2", "--gpus-per-node=2", "--", "--no-container", "recipe.py", env=env
    )

    assert NODE2_HUNG in log
    assert f"srun.sh: failed the health check on node2: requeueing job {job}" in log
    assert f"srun.sh: job {job} runs without node2 from now on (ExcNodeList=node2)" in log
    assert "srun.sh: health check passed on all 1 node(s)" in log  # the second attempt, on node1 alone
    records = slurm_world.records()
    assert sorted(records) == [0, 1]
    assert {record["host"] for record in records.values()} == {"node1"}
    assert {record["env"]["SLURM_RESTART_COUNT"] for record in records.values()} == {"1"}
    history = (slurm_world.dir / "outputs" / "recipe" / job / "logs" / "requeues.log").read_text()
    assert "restart 0: failed the health check on node2" in history


def test_batch_job_that_excludes_the_nodes_failing_its_health_check_keeps_the_exclusions_it_had(
    slurm_world_three: SrunWorld,
):
    """The user's own `sbatch --exclude=node3` holds after node2 failed the check: the job runs on node1 alone."""
    env = {"SRUNSH_HEALTH": "1", "SRUNSH_HEALTH_TIMEOUT_S": str(HANG_DEADLINE_S), "FAKE_HEALTH_HANG": "node2"}
    launch = ["--nodes=1-2", "--exclude=node3", "--gpus-per-node=2", "--", "--no-container", "recipe.py"]
    job, log = wait_for_batch_job(slurm_world_three, *launch, env={**env, "SRUNSH_MAX_RETRIES": "1"})

    assert NODE2_HUNG in log
    assert f"srun.sh: job {job} runs without node2 from now on (ExcNodeList=node3,node2)" in log
    assert "srun.sh: health check passed on all 1 node(s)" in log  # the second attempt, on node1 alone
    records = slurm_world_three.records()
    assert sorted(records) == [0, 1]
    assert {record["host"] for record in records.values()} == {"node1"}


def test_health_check_with_local_measures_the_node_among_its_ranks(srun_world: SrunWorld):
    result = srun_world.srun_sh("--local", "--health", env=TWO_BY_TWO, timeout=120)

    assert result.returncode == 0, result.stdout + result.stderr
    report = results(only_run_dir(srun_world))
    (node,) = report["nodes"]
    assert node["ranks"] == [0, 1] and node["verdict"] == "ok"
    assert node["figures"]["node.all_reduce"] > 0 and node["figures"]["node.broadcast"] > 0
    assert list(report["ranks"]["0"]["results"]) == ["start", "gpu", "node.all_reduce", "node.broadcast"]


def test_dry_run_with_health_shows_the_check_before_the_launch(srun_world: SrunWorld):
    result = srun_world.srun_sh("--dry-run", "--local", "recipe.py", env={**TWO_BY_TWO, "SRUNSH_HEALTH": "1"})

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    check = lines[lines.index("# Health check, run first (SRUNSH_HEALTH=1):") + 1]
    assert check.endswith(
        f"--no-python {SRUN_SH} --rank-exec {srun_world.env['SRUNSH_PYTHON']} {SRUN_SH.parent}/launcher/health.py"
    )
    assert lines[-1].endswith("entrypoint.py recipe.py") and srun_world.calls() == []


def test_a_node_whose_link_is_capped_is_condemned_on_its_retests_with_their_samples(slurm_world_three: SrunWorld):
    with capped_link(slurm_world_three.cluster, "node3", 500):
        result, _ = slurm_world_three.in_allocation("--no-container", "--health", salloc=THREE_NODES, env=ONE_RANK)

    assert result.returncode == 1, result.stdout + result.stderr
    rows = table_rows(result.stdout)
    assert (rows["node1"][-1], rows["node2"][-1], rows["node3"][-1]) == ("OK", "OK", "SLOW")
    lines = result.stdout.splitlines()
    named = [line for line in lines if line.startswith("srun.sh: node3: pair broadcast with node1 and node2 ")]
    assert named and named[0].endswith(": exclude it: --exclude=node3"), lines
    chance = float(re.search(r"noise ranks them so in ([\d.e-]+) of checks", named[0]).group(1))
    assert chance <= 1 / 1000  # docs/health.md: at most 1 in 1,000 checks
    assert any(line.startswith("srun.sh: node3:   pair broadcast best sample of each retest") for line in lines)
    report = results(only_run_dir(slurm_world_three))
    assert report["failed_nodes"] == ["node3"] and report["suspect_nodes"] == []
    evidence = next(e for e in report["nodes"][2]["evidence"] if e["figure"] == "pair broadcast")
    capped = evidence["samples"]["node1 node3"] + evidence["samples"]["node2 node3"]
    assert len(capped) == 12 and max(capped) < CAP_GB_S * 1.05  # what tbf lets through, and no more
    assert statistics.median(evidence["samples"]["node1 node2"]) > 2 * CAP_GB_S


def test_checks_of_the_uncapped_three_node_cluster_condemn_no_node(slurm_world_three: SrunWorld):
    result, _ = slurm_world_three.in_allocation("--no-container", "--health", salloc=THREE_NODES, env=ONE_RANK)

    assert result.returncode == 0, result.stdout + result.stderr
    report = results(only_run_dir(slurm_world_three))
    assert report["passed"] and report["failed_nodes"] == [] and report["outcome"] == "finished"
    assert "srun.sh: health check passed on all 3 node(s)" in result.stdout
    print(f"\n[health] 3 nodes, uncapped: {report['seconds']} s, suspect: {report['suspect_nodes']}")
