"""How launcher/health_report.py judges the ranks' records (the verdicts the SLURM tests cannot reach on one shared CPU:
GPU figures, four nodes, a rank that never started, a hang of the whole job), and how launcher/health.py pairs nodes.

The records are shaped as launcher/health.py writes them; the runs of the real check are in tests/test_srun_health.py.
"""

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import health_report
from launcher.health import pair_rounds
from launcher.health_report import Layout, Run

MIB = str(256 << 20)


def collective(ranks: list[int], busbw: float, best: float | None = None) -> dict:
    return {"ranks": ranks, "busbw_gb_s": {MIB: busbw}, "busbw_gb_s_best": {MIB: best or busbw * 1.01}, "seconds": 1}


def gpu(uuid: str, matmul: float = 780.0, device: int = 0) -> dict:
    result = {"applicable": True, "visible": 8, "device": device, "uuid": uuid, "free_gib": 139.0}
    return result | {
        "matmul_tflops": matmul,
        "matmul_tflops_best": matmul * 1.01,
        "hbm_tb_s": 4.3,
        "hbm_tb_s_best": 4.35,
    }


def healthy(layout: Layout, node_busbw: dict[str, float] | None = None, matmul: dict[int, float] | None = None):
    """The records of a check that finished on every rank, with the figures given (others the same everywhere)."""
    records = {}
    for rank in range(layout.world):
        host = layout.host(rank)
        node = layout.ranks(host)
        results = {"start": {"backend": "nccl", "seconds": 1}, "gpu": gpu(f"GPU-{rank}", (matmul or {}).get(rank, 780))}
        results["node.all_reduce"] = collective(node, (node_busbw or {}).get(host, 360.0))
        results["node.broadcast"] = collective(node, 350.0)
        index = layout.hosts.index(host)
        for round_, partner in pair_rounds(len(layout.hosts), index):
            if partner is None:
                continue
            pair = sorted(node + layout.ranks(layout.hosts[partner]))
            results[f"pair.{round_}.all_reduce"] = collective(pair, 95.0) | {"partner": layout.hosts[partner]}
            results[f"pair.{round_}.broadcast"] = collective(pair, 94.0) | {"partner": layout.hosts[partner]}
        records[rank] = {"rank": rank, "host": host, "part": None, "stage": None, "group": None, "results": results}
        records[rank] |= {"error": None, "finished": True}
    return records


def judged(layout: Layout, records: dict, outcome: str = "finished", late: list[int] | None = None, tmp_path=None):
    run = Run(tmp_path, layout, records, outcome, late or [], 60.0, 30.0)
    nodes, job = health_report.judge(run)
    return {node.host: node for node in nodes}, job


@pytest.fixture
def four_nodes() -> Layout:
    return Layout(["a", "b", "c", "d"], 2)


def test_every_node_passes_when_every_figure_is_near_the_median(four_nodes: Layout, tmp_path):
    nodes, job = judged(four_nodes, healthy(four_nodes, {"a": 350.0, "b": 362.0}), tmp_path=tmp_path)

    assert job == "" and {node.verdict for node in nodes.values()} == {"ok"}
    assert nodes["a"].figures["pair.all_reduce"] == 95.0


def test_node_more_than_ten_percent_below_the_median_is_slow_and_named(four_nodes: Layout, tmp_path):
    nodes, _ = judged(four_nodes, healthy(four_nodes, {"c": 300.0}), tmp_path=tmp_path)

    assert [host for host, node in nodes.items() if node.failed] == ["c"]
    assert nodes["c"].reasons == ["node all-reduce 300 GB/s is 17% below the median 360"]


def test_gpu_below_the_median_names_its_rank(four_nodes: Layout, tmp_path):
    nodes, _ = judged(four_nodes, healthy(four_nodes, matmul={5: 612.0}), tmp_path=tmp_path)

    assert nodes["c"].verdict == "slow"
    assert nodes["c"].reasons == ["rank 5: bf16 matmul 612 is 22% below the median 780"]
    assert nodes["c"].figures["matmul_tflops"] == 612.0 and nodes["c"].figure_ranks["matmul_tflops"] == 5


def test_noise_that_spreads_every_nodes_samples_is_no_outlier(four_nodes: Layout, tmp_path):
    """On a shared CPU each node's samples spread widely; a difference within that spread is not a slow node."""
    records = healthy(four_nodes)
    for rank, record in records.items():
        record["results"]["node.all_reduce"] = collective(four_nodes.ranks(four_nodes.host(rank)), 0.2, best=0.6)
    records[0]["results"]["node.all_reduce"] = records[1]["results"]["node.all_reduce"] = collective([0, 1], 0.12, 0.5)

    nodes, _ = judged(four_nodes, records, tmp_path=tmp_path)

    assert not any(node.failed for node in nodes.values())


def test_two_ranks_on_one_gpu_fail_their_node(four_nodes: Layout, tmp_path):
    records = healthy(four_nodes)
    records[3]["results"]["gpu"] = gpu("GPU-2", device=1)

    nodes, _ = judged(four_nodes, records, tmp_path=tmp_path)

    assert nodes["b"].verdict == "fail" and nodes["b"].reasons == ["ranks 2 and 3 share one GPU (GPU-2)"]


def test_hang_is_on_the_ranks_that_never_reached_the_part_not_on_those_waiting(four_nodes: Layout, tmp_path):
    records = healthy(four_nodes)
    for rank in (2, 3):  # node b is stuck in its own broadcast; a waits for b in pair round 0
        records[rank] |= {"part": "node.broadcast", "stage": "running", "group": [2, 3], "finished": False}
    for rank in (0, 1):
        records[rank] |= {"part": "pair.0.all_reduce", "stage": "group", "group": [0, 1, 2, 3], "finished": False}

    nodes, job = judged(four_nodes, records, "deadline", late=[0, 1, 2, 3], tmp_path=tmp_path)

    assert (nodes["a"].verdict, nodes["b"].verdict, nodes["c"].verdict) == ("blocked", "hang", "ok")
    assert "node broadcast did not finish within 60 s (ranks 2-3)" in nodes["b"].reasons
    assert "rank 2 never reached pair round 0 all-reduce: still in node broadcast" in nodes["b"].reasons
    assert job == ""


def test_rank_that_never_started_is_named_at_the_start_deadline(four_nodes: Layout, tmp_path):
    records = healthy(four_nodes)
    for record in records.values():
        record |= {"part": "start", "stage": "rendezvous", "group": None, "finished": False, "results": {}}
    del records[6]

    nodes, _ = judged(four_nodes, records, "deadline", late=[0, 1, 2, 3, 4, 5, 7], tmp_path=tmp_path)

    assert nodes["d"].verdict == "hang"
    assert (
        "rank 6 never reached the start (torch import, rendezvous): no record: it never started" in nodes["d"].reasons
    )
    assert [host for host, node in nodes.items() if node.failed] == ["d"]


def test_hang_of_the_whole_job_blames_no_node(four_nodes: Layout, tmp_path):
    records = healthy(four_nodes)
    for record in records.values():
        record |= {"part": "job.broadcast", "stage": "running", "group": list(range(8)), "finished": False}

    nodes, job = judged(four_nodes, records, "deadline", late=list(range(8)), tmp_path=tmp_path)

    assert not any(node.failed for node in nodes.values())
    assert job.startswith("job broadcast did not finish within 60 s (ranks 0-7): every rank was in it")


def test_console_table_names_each_failed_node_with_the_fix(four_nodes: Layout, tmp_path):
    records = healthy(four_nodes, {"c": 300.0})
    run = Run(tmp_path, four_nodes, records, "finished", [], 60.0, 31.2)
    nodes, job = health_report.judge(run)

    lines = health_report.console(run, nodes, job)

    assert lines[0].startswith("srun.sh: health check of 4 node(s) x 2 rank(s) over nccl, 31.2 s;")
    assert lines[1].split()[:3] == ["node", "ranks", "GPUs"]
    assert lines[4].split() == ["c", "4-5", "2/2", "139", "780", "4.3", "300", "350", "95", "94", "SLOW"]
    assert "srun.sh: c: node all-reduce 300 GB/s is 17% below the median 360: exclude it: --exclude=c" in lines
    assert lines[-1].startswith("srun.sh: health check failed on 1 of 4 node(s): c (salloc/sbatch --exclude=c)")


@pytest.mark.parametrize("count", [2, 3, 5, 8, 64, 500])
def test_pair_rounds_give_every_node_a_new_partner_in_ceil_log2_rounds(count: int):
    rounds: dict[int, list[tuple[int, int]]] = {}
    for node in range(count):
        for round_, partner in pair_rounds(count, node):
            rounds.setdefault(round_, [])
            if partner is not None:
                rounds[round_].append((node, partner))

    assert len(rounds) == math.ceil(math.log2(count))
    for pairs in rounds.values():
        assert all((partner, node) in pairs for node, partner in pairs)  # both sides agree: a matching
        assert len({node for node, _ in pairs}) == len(pairs)  # a node is in one pair a round
    partners = {node: [p for pairs in rounds.values() for n, p in pairs if n == node] for node in range(count)}
    assert all(len(set(p)) == len(p) for p in partners.values())  # never the same partner twice
    if count & (count - 1) == 0:  # a power of two: N/2 pairs every round, every node in each
        assert all(len(pairs) == count for pairs in rounds.values())
    assert len(set(itertools.chain.from_iterable(partners.values()))) == count


def test_three_nodes_go_through_the_same_parts_and_the_idle_one_waits_at_the_barriers(tmp_path):
    """A node count that is not a power of two leaves a node without a partner in some round: the real check on
    three gloo ranks under torchrun, each its own "node" (a host name of its own, the stand-in's only part),
    finishes."""
    health = Path(health_report.__file__).with_name("health.py")
    wrapper = tmp_path / "rank.py"
    wrapper.write_text(
        "import os, runpy, socket, sys\n"
        "socket.gethostname = lambda: 'n' + os.environ['RANK']\n"
        f"sys.argv = [{str(health)!r}]\n"
        f"runpy.run_path({str(health)!r}, run_name='__main__')\n"
    )
    port = str(20000 + os.getpid() % 10000)
    launch = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=3",
        f"--master-port={port}",
        str(wrapper),
    ]
    env = {"RUN_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, health_report.__file__, str(tmp_path), "--timeout", "60", "--nodes", "n0,n1,n2",
         "--ranks-per-node", "1", "--", *launch],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip

    report = json.loads((tmp_path / "health.json").read_text())
    assert report["outcome"] == "finished", result.stdout + result.stderr  # verdicts: noise on one shared CPU
    parts = {rank: list(record["results"]) for rank, record in report["ranks"].items()}
    assert parts["0"] == ["start", "gpu", *PAIR_PARTS[0], *PAIR_PARTS[1], "job.all_reduce", "job.broadcast"]
    assert parts["1"] == ["start", "gpu", *PAIR_PARTS[0], "job.all_reduce", "job.broadcast"]  # no partner in round 1
    assert parts["2"] == ["start", "gpu", *PAIR_PARTS[1], "job.all_reduce", "job.broadcast"]  # none in round 0


PAIR_PARTS = {k: [f"pair.{k}.all_reduce", f"pair.{k}.broadcast"] for k in (0, 1)}
