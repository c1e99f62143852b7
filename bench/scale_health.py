"""The health check's records of the simulated job (bench/scale_tree.py), written by launcher/health/check.py's Record
with every result a rank's Check.run records: the GPU figures, the node, pair, retest and job-wide collectives, with 1%
noise, and every pair of the slow node capped (on fewer than 3 nodes, one slow GPU instead)."""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Iterator
from pathlib import Path

from bench.scale_tree import PER_NODE, Job
from launcher.health import check

GPU_FIGURES = {"matmul": 780.0, "hbm": 4.3}
LINK_FIGURES = {"node.all_reduce": 360.0, "node.broadcast": 350.0, "pair.all_reduce": 95.0, "pair.broadcast": 94.0}
LINK_FIGURES |= {"job.all_reduce": 90.0, "job.broadcast": 45.0}
CAPPED = 40.0  # GB/s of every pair of the slow node


def noisy(key: str, mean: float, count: int) -> list[float]:
    """`count` samples of a figure around `mean` (1% noise, the same for the same key in every process)."""
    rng = random.Random(key)
    return [mean * (1 + rng.uniform(-0.01, 0.01)) for _ in range(count)]


def link_rates(job: Job, part: str, ranks: list[int], rank: int, *, sizes: tuple[int, ...], count: int) -> dict:
    """A collective part's result on `rank` as check.py's Check.collectives records it: bus bandwidth at each size
    (latency costs the smaller ones), its best sample and every sample at the largest."""
    stage, op = part.split(".", 1)[0], part.rsplit(".", 1)[1]
    nodes = {member // PER_NODE for member in ranks}
    kind = "node" if stage == "node" else "job" if stage == "job" else "pair"
    figure = CAPPED if job.link_fault and kind == "pair" and job.slow_node in nodes else LINK_FIGURES[f"{kind}.{op}"]
    median, best, samples = {}, {}, []
    for size in sizes:
        factor = 2 * (len(ranks) - 1) / len(ranks) if op == "all_reduce" else 1.0  # as check.py's bus_bandwidth
        work = size * factor / 1e9
        latency = 2e-5 * (len(nodes) if kind == "job" else 1)
        seconds = [work / value + latency for value in noisy(f"{part}-{size}-{rank}", figure, count)]
        median[str(size)], best[str(size)], samples = check.rates(work, seconds)
    return {"ranks": ranks, "busbw_gb_s": median, "busbw_gb_s_best": best, "busbw_gb_s_samples": samples}


def gpu_result(job: Job, rank: int) -> dict:
    matmul = GPU_FIGURES["matmul"] * (0.77 if not job.link_fault and rank == job.slow_gpu else 1.0)
    work = 2 * check.MATMUL_N**3 / 1e12
    rates = check.rates(work, [work / value for value in noisy(f"matmul-{rank}", matmul, check.SAMPLES)])
    copy = 2 * check.COPY_BYTES / 1e12
    hbm = check.rates(copy, [copy / value for value in noisy(f"hbm-{rank}", GPU_FIGURES["hbm"], check.SAMPLES)])
    result = {"applicable": True, "visible": PER_NODE, "device": rank % PER_NODE, "name": "NVIDIA H200"}
    result |= {"uuid": f"GPU-{rank:08x}-5f1e-4c2a-9b7d-{rank:012x}", "free_gib": 139.3, "total_gib": 139.8}
    result |= dict(zip(("matmul_tflops", "matmul_tflops_best", "matmul_tflops_samples"), rates, strict=True))
    return result | dict(zip(("hbm_tb_s", "hbm_tb_s_best", "hbm_tb_s_samples"), hbm, strict=True))


def pair_figures(job: Job) -> dict[str, dict[tuple[int, int], float]]:
    """What Check.pair_figures gathers from every rank: each pair of nodes' figure per op (and "op best"), its
    slowest member's."""
    nodes = job_nodes(job)
    figures: dict[str, dict[tuple[int, int], float]] = {}
    for round_ in range(math.ceil(math.log2(job.nodes))):
        for a, b in check.round_pairs(job.nodes, round_):
            ranks = check.pair_ranks(nodes, a, b)
            for op in ("all_reduce", "broadcast"):
                part = f"pair.{round_}.{op}"
                results = [
                    link_rates(job, part, ranks, rank, sizes=check.GPU_SIZES, count=check.SAMPLES) for rank in ranks
                ]
                largest = str(check.GPU_SIZES[-1])
                figures.setdefault(op, {})[a, b] = min(r["busbw_gb_s"][largest] for r in results)
                figures.setdefault(f"{op} best", {})[a, b] = min(r["busbw_gb_s_best"][largest] for r in results)
    return figures


@functools.cache
def job_nodes(job: Job) -> list[list[int]]:
    """Each node's ranks, as check.py's node_ranks finds them from every rank's host (one list a job, shared)."""
    return check.node_ranks([job.host(rank) for rank in range(job.ranks)])


def health_plan(job: Job) -> list[list[tuple[int, str, tuple[int, int]]]]:
    """The retests every rank plans from the pair figures (check.py's retest_plan), none on fewer than 3 nodes."""
    if job.nodes <= 2:
        return []
    return check.retest_plan({op: check.best_pairs(pairs) for op, pairs in pair_figures(job).items()})


class StagedRecord(check.Record):
    """check.py's Record, written once, when the rank finishes: the report reads the finished record, and the
    check's writes at every part are what its polls read meanwhile, which this bench does not time."""

    def write(self) -> None:
        if self.data["finished"]:
            super().write()


def measured_parts(job: Job, rank: int, plan: list) -> Iterator[tuple[str, list[int], dict, bool]]:
    """The collective parts `rank` measures, in Check.run's order (it sits the others out): (prefix, ranks, what the
    result adds, whether a retest)."""
    nodes, mine = job_nodes(job), rank // PER_NODE
    yield "node", nodes[mine], {}, False
    for round_, partner in check.pair_rounds(job.nodes, mine):
        if partner is not None:
            extra = {"partner": job.host(nodes[partner][0])}
            yield f"pair.{round_}", check.pair_ranks(nodes, mine, partner), extra, False
    for index, step in enumerate(plan):  # Check.retests: this rank's part of each step of the plan
        if own := next((m for m in step if mine in m[2]), None):
            suspect, role, (a, b) = own
            extra = {"suspect": job.hosts[suspect], "role": role, "pair": [job.hosts[a], job.hosts[b]]}
            yield f"retest.{index}", check.pair_ranks(nodes, a, b), extra, True
    if job.nodes > 1:
        yield "job", list(range(job.ranks)), {}, False


def write_health_rank(health: Path, job: Job, rank: int, plan: list) -> None:
    """`rank`'s health record with every result Check.run records, written as check.py's Record writes it."""
    identity = {"rank": rank, "local_rank": rank % PER_NODE, "host": job.host(rank), "pid": 4000 + rank}
    record = StagedRecord(health / f"rank-{rank}.json", identity)
    record.enter("start")
    record.done({"backend": "nccl", "world_size": job.ranks})
    record.enter("gpu", [rank])
    record.done(gpu_result(job, rank))
    for prefix, ranks, extra, retest in measured_parts(job, rank, plan):
        sizes, count = (check.GPU_SIZES[-1:], check.RETEST_SAMPLES) if retest else (check.GPU_SIZES, check.SAMPLES)
        recorded = check.JOB if len(ranks) == job.ranks else ranks  # as check.py records a group
        for part in (f"{prefix}.all_reduce", f"{prefix}.broadcast"):
            record.enter(part, recorded)
            record.done({**extra, **link_rates(job, part, ranks, rank, sizes=sizes, count=count), "ranks": recorded})
    record.finish()
