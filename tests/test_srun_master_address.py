"""The master address on a cluster that names its nodes only by name (no NodeAddr) and whose first node resolves its
own name only to Debian's 127.0.1.1: srun.sh, running on that node, takes the address of its interface that routes
to the other nodes, says so once, and the ranks of both nodes meet there.

Runs on `slurm_cluster_by_name` (tests/slurm_cluster.py); tests/fixtures/fake_python's FAKE_RENDEZVOUS=1 makes the
ranks really join torch.distributed (gloo) and all-reduce, so a wrong address fails the rendezvous."""

from tests.slurm_cluster import ADDRESSES, NODES
from tests.srun_world import ALLOCATION, REPO, SrunWorld

pytest_plugins = ["tests.srun_world"]

RENDEZVOUS = {"FAKE_RENDEZVOUS": "1", "SRUNSH_GPUS_PER_NODE": "4"}
CHOSEN = (
    f"srun.sh: node1's name gives no address but loopback here; MASTER_ADDR={ADDRESSES['node1']}, the address of"
    f" eth0, which routes to node2 ({ADDRESSES['node2']})"
)


def assert_eight_ranks_met_at_node1(world: SrunWorld) -> None:
    records = world.records()
    assert sorted(records) == list(range(8))
    assert {r["host"] for r in records.values()} == set(NODES)
    for rank, record in records.items():
        assert record["env"]["MASTER_ADDR"] == ADDRESSES["node1"]
        assert record["env"]["GLOO_SOCKET_IFNAME"] == "eth0"
        assert record["rendezvous"] == {"rank": rank, "world_size": 8, "sum": 36}


def test_node1_knows_its_own_name_only_as_loopback(slurm_world_by_name: SrunWorld):
    cluster = slurm_world_by_name.cluster
    assert cluster.run(["getent", "ahostsv4", "node1"], host="node1").stdout.split()[0] == "127.0.1.1"
    assert ADDRESSES["node1"] not in cluster.run(["getent", "ahostsv4", "node1"], host="node1").stdout
    node = cluster.run(["scontrol", "show", "node", "--oneliner", "node1"]).stdout
    assert " NodeAddr=node1 " in node


def test_sbatch_on_a_node_known_only_as_loopback_takes_the_address_that_routes_to_the_others(
    slurm_world_by_name: SrunWorld,
):
    world = slurm_world_by_name
    result = world.on_login_node(
        ["sbatch", "--wait", *ALLOCATION, "--output=job.out", f"--wrap={REPO}/srun.sh --no-container recipe.py"],
        env=RENDEZVOUS,
    )

    log = (world.dir / "job.out").read_text()
    assert result.returncode == 0, log
    assert [line for line in log.splitlines() if "MASTER_ADDR=" in line] == [CHOSEN]
    assert_eight_ranks_met_at_node1(world)


def test_salloc_from_the_first_node_takes_the_address_that_routes_to_the_others(slurm_world_by_name: SrunWorld):
    world = slurm_world_by_name
    result = world.cluster.run(
        ["salloc", "--quiet", *ALLOCATION, str(REPO / "srun.sh"), "--no-container", "recipe.py"],
        host="node1",
        env={**world.env, **RENDEZVOUS},
        cwd=world.dir,
        timeout=120,
    )

    assert result.returncode == 0, result.stderr
    assert [line for line in result.stderr.splitlines() if "MASTER_ADDR=" in line] == [CHOSEN]
    assert_eight_ranks_met_at_node1(world)


def test_dry_run_on_the_first_node_shows_the_chosen_address(slurm_world_by_name: SrunWorld):
    world = slurm_world_by_name
    result = world.cluster.run(
        ["salloc", "--quiet", *ALLOCATION, str(REPO / "srun.sh"), "--dry-run", "--no-container", "recipe.py"],
        host="node1",
        env=world.env,
        cwd=world.dir,
    )

    assert result.returncode == 0, result.stderr
    assert f"export MASTER_ADDR={ADDRESSES['node1']}" in result.stdout.splitlines()
    assert result.stderr.splitlines() == [CHOSEN]
    assert world.records() == {}


def test_from_the_login_node_a_first_node_known_only_by_name_is_resolved_there(slurm_world_by_name: SrunWorld):
    """ctl resolves node1 by its hosts file; nothing to choose, nothing said."""
    result, _ = slurm_world_by_name.in_allocation("--no-container", "recipe.py", env=RENDEZVOUS)

    assert result.returncode == 0, result.stderr
    assert "MASTER_ADDR=" not in result.stderr
    assert_eight_ranks_met_at_node1(slurm_world_by_name)
