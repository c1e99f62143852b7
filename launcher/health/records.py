"""What a health check's launch leaves, as the launching host reads it: each rank's record (RUN_DIR/health/rank-R.json,
written by check.py) and exit status, the order and deadline of the parts, and each collective part's figures."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from pathlib import Path

START_FACTOR = 3  # the start (container, python, torch import, rendezvous) may take this many deadlines


@dataclasses.dataclass
class Layout:
    hosts: list[str]  # in rank order
    per_node: int

    @functools.cached_property
    def index(self) -> dict[str, int]:
        """Each host's position in `hosts` (its first, as list.index), looked up once per host, not per rank."""
        return {host: index for index, host in reversed(list(enumerate(self.hosts)))}

    @property
    def world(self) -> int:
        return len(self.hosts) * self.per_node

    def host(self, rank: int) -> str:
        return self.hosts[rank // self.per_node]

    def ranks(self, host: str) -> list[int]:
        first = self.index[host] * self.per_node
        return list(range(first, first + self.per_node))


@dataclasses.dataclass
class Run:
    """What the check's launch left: the ranks' records, how it ended, and the ranks past a deadline."""

    run_dir: Path
    layout: Layout
    records: dict[int, dict]
    outcome: str  # finished, exited, deadline, stopped
    late: list[int]
    timeout: float
    seconds: float


def ranges(ranks: list[int]) -> str:
    ordered = sorted(ranks)
    if ordered and ordered == list(range(ordered[0], ordered[-1] + 1)) and len(ordered) > 1:
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(str(rank) for rank in ordered)


class RankRecord(dict):
    """A rank's record, and the text it was read from: health.json repeats that text rather than encode the record
    again (for 4,096 ranks JSON's encoder takes longer than the rest of the report)."""

    text: str


def read_record(path: Path) -> RankRecord:
    text = path.read_text()
    record = RankRecord(json.loads(text))
    record.text = text
    return record


def read_records(health: Path, world: int, known: dict[int, dict] | None = None) -> dict[int, dict]:
    """Every rank's record; a finished one in `known` is not read again (a poll of 4,096 files on a shared file
    system is not free)."""
    records = {rank: record for rank, record in (known or {}).items() if record["finished"]}
    for rank in (rank for rank in range(world) if rank not in records):
        with contextlib.suppress(OSError, ValueError):  # not written yet, or being replaced: the next poll reads it
            records[rank] = read_record(health / f"rank-{rank}.json")
    return records


def exit_statuses(run_dir: Path, world: int) -> dict[int, str]:
    """How each rank ended, from launcher/rank/rank.sh's RUN_DIR/logs/rank-R.status."""
    statuses = {}
    for rank in range(world):
        with contextlib.suppress(OSError, IndexError):
            statuses[rank] = (run_dir / "logs" / f"rank-{rank}.status").read_text().split()[0]
    return statuses


def deadline(part: str, timeout: float) -> float:
    return START_FACTOR * timeout if part == "start" else timeout


def part_order(part: str) -> tuple[int, int, int]:
    """Where a part comes in every rank's sequence (start, gpu, node, pair rounds, retests, job)."""
    stage, *rest = part.split(".")
    base = {"start": 0, "gpu": 1, "node": 2, "pair": 3, "retest": 4, "job": 5}[stage]
    number = int(rest[0]) if stage in ("pair", "retest") else 0
    op = 1 if part.endswith("broadcast") else 0
    return base, number, op


def describe(part: str) -> str:
    words = part.replace("all_reduce", "all-reduce").split(".")
    if words[0] in ("pair", "retest"):
        return f"{words[0]} round {words[1]} {words[2]}"
    return {"start": "the start (torch import, rendezvous)", "gpu": "the GPU test"}.get(part, " ".join(words))


def largest(bandwidth: dict[str, float]) -> float | None:
    return bandwidth[largest_size(tuple(bandwidth))] if bandwidth else None


@functools.cache
def largest_size(sizes: tuple[str, ...]) -> str:
    """The largest of a result's sizes, found once for each set of sizes (every member of a part has the same)."""
    return max(sizes, key=int)


def part_results(records: dict[int, dict], ranks: list[int], part: str) -> list[dict]:
    """The results of a collective part on every member of the group that the first of `ranks` in it was in (a
    group of None: the whole job, launcher/health/check.py's JOB)."""
    holder = next((r for r in ranks if part in records[r]["results"]), None)
    if holder is None:
        return []
    group = records[holder]["results"][part]["ranks"]
    members = sorted(records) if group is None else group
    return [records[rank]["results"][part] for rank in members if part in records.get(rank, {}).get("results", {})]


def link_figures(records: dict[int, dict], ranks: list[int], part: str) -> tuple[float | None, float | None]:
    """A collective part's bus bandwidth at its largest size, as its group got it: a collective takes as long as its
    slowest member (a broadcast's root is done early), so the slowest member's median, and its best sample."""
    results = part_results(records, ranks, part)
    if not results:
        return None, None
    medians = [largest(result["busbw_gb_s"]) for result in results]
    bests = [largest(result.get("busbw_gb_s_best") or result["busbw_gb_s"]) for result in results]
    return min(m for m in medians if m is not None), min(b for b in bests if b is not None)


def link_samples(records: dict[int, dict], ranks: list[int], part: str) -> list[float]:
    """The samples at the largest size of a collective part's slowest member (whose median is the figure)."""
    results = part_results(records, ranks, part)
    slowest = min(results, key=lambda result: largest(result["busbw_gb_s"]) or 0.0, default={})
    return slowest.get("busbw_gb_s_samples", [])


def retests(records: dict[int, dict]) -> list[dict]:
    """Every retest measurement of a pair, as measured: suspect, role (same, other, reference), pair, op, its figure
    (the slowest member's best sample: noise only slows a sample, a capped link caps every one) and its samples."""
    measured: dict[tuple[str, tuple[int, ...]], dict] = {}
    for record in records.values():
        for part, result in record["results"].items():
            key = (part, tuple(result.get("ranks") or ()))
            if not part.startswith("retest.") or "suspect" not in result or key in measured:
                continue
            figure = link_figures(records, result["ranks"], part)[1]
            measured[key] = {**{k: result[k] for k in ("suspect", "role", "pair")}, "op": part.rsplit(".", 1)[1]}
            measured[key] |= {"figure": figure, "samples": link_samples(records, result["ranks"], part)}
    return [measured[key] for key in sorted(measured, key=lambda key: (part_order(key[0]), key[1]))]
