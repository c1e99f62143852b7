"""Each node's health-check verdict from the ranks' records and exit statuses (docs/health.md); stdlib only."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import statistics
from pathlib import Path

from launcher.run_files import LAUNCHER_LOG, STOPPED

START_FACTOR = 3  # the start (container, python, torch import, rendezvous) may take this many deadlines
OUTLIER = 0.9  # a figure below 90% of the job's median is an outlier
NOISE_CHANCE = 0.001  # a link is condemned when noise would rank its retests so in at most 1 check of 1,000
SUSPECT_CHANCE = 0.05  # and is suspect, when low, at 1 in 20: what noise does more often is no finding
GPU_FIGURES = (  # key of the GPU part's result, column, name
    ("free_gib", "free GiB", "free memory"),
    ("matmul_tflops", "matmul TF/s", "bf16 matmul"),
    ("hbm_tb_s", "HBM TB/s", "HBM copy"),
)
LINK_FIGURES = (  # key of a node's figures, column, name
    ("node.all_reduce", "node AR", "node all-reduce"),
    ("node.broadcast", "node BC", "node broadcast"),
    ("pair.all_reduce", "pair AR", "best pair all-reduce"),
    ("pair.broadcast", "pair BC", "best pair broadcast"),
)
ENDED_WELL = {"0", *map(str, STOPPED)}  # a rank that exited 0 or was stopped (the check stops a late one) did not fail
VERDICTS = ("ok", "suspect", "blocked", "slow", "fail", "hang")  # worse verdicts win


@dataclasses.dataclass
class Layout:
    hosts: list[str]  # in rank order
    per_node: int

    # Each host's first position (as list.index), found once per host rather than once per rank.
    @functools.cached_property
    def index(self) -> dict[str, int]:
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
    run_dir: Path
    layout: Layout
    records: dict[int, dict]  # by rank, of those that wrote one
    outcome: str  # finished, exited, deadline, stopped
    late: list[int]  # the ranks past a part's deadline
    timeout: float
    seconds: float


@dataclasses.dataclass
class Node:
    host: str
    ranks: list[int]
    figures: dict[str, float | None] = dataclasses.field(default_factory=dict)  # medians of the samples
    best: dict[str, float | None] = dataclasses.field(default_factory=dict)  # the best samples
    figure_ranks: dict[str, int] = dataclasses.field(default_factory=dict)  # which rank a per-GPU minimum is
    gpus: str = "n/a"
    verdict: str = "ok"
    reasons: list[str] = dataclasses.field(default_factory=list)
    evidence: list[dict] = dataclasses.field(default_factory=list)  # the samples each flagged figure rests on

    def fail(self, verdict: str, reason: str) -> None:
        self.verdict = max(self.verdict, verdict, key=VERDICTS.index)
        self.reasons.append(reason)

    @property
    def failed(self) -> bool:
        return self.verdict in ("slow", "fail", "hang")


def ranges(ranks: list[int]) -> str:
    ordered = sorted(ranks)
    if ordered and ordered == list(range(ordered[0], ordered[-1] + 1)) and len(ordered) > 1:
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(str(rank) for rank in ordered)


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
    return base, number, 1 if part.endswith("broadcast") else 0


def describe(part: str) -> str:
    words = part.replace("all_reduce", "all-reduce").split(".")
    if words[0] in ("pair", "retest"):
        return f"{words[0]} round {words[1]} {words[2]}"
    return {"start": "the start (torch import, rendezvous)", "gpu": "the GPU test"}.get(part, " ".join(words))


def largest(bandwidth: dict[str, float]) -> float:
    return bandwidth[largest_size(tuple(bandwidth))]


@functools.cache  # every member of a part has the same sizes: found once for each set
def largest_size(sizes: tuple[str, ...]) -> str:
    return max(sizes, key=int)


def link(records: dict[int, dict], ranks: list[int], part: str) -> tuple[float | None, float | None, list[float]]:
    """A part's bus bandwidth at its largest size: slowest member's median, lowest best, its samples."""
    holder = next((r for r in ranks if part in records[r]["results"]), None)
    if holder is None:
        return None, None, []
    group = records[holder]["results"][part]["ranks"]
    members = sorted(records) if group is None else group
    results = [records[m]["results"][part] for m in members if part in records.get(m, {}).get("results", {})]
    slowest = min(results, key=lambda result: largest(result["busbw_gb_s"]))
    best = min(largest(result.get("busbw_gb_s_best") or result["busbw_gb_s"]) for result in results)
    return largest(slowest["busbw_gb_s"]), best, slowest.get("busbw_gb_s_samples", [])


def gpu_results(records: dict[int, dict], ranks: list[int]) -> dict[int, dict]:
    return {rank: records[rank]["results"].get("gpu") or {} for rank in ranks if rank in records}


def fill_figures(node: Node, records: dict[int, dict]) -> None:
    """The node's figures: its worst GPU's, its own collectives', its best pair's (docs/health.md)."""
    ranks = [rank for rank in node.ranks if rank in records]
    gpu = gpu_results(records, ranks)
    applicable = [rank for rank in ranks if gpu[rank].get("applicable")]
    if applicable:
        node.gpus = f"{len(applicable)}/{len(node.ranks)}"
    uuids: dict[str, int] = {}
    for rank in applicable:
        result = gpu[rank]
        if result["visible"] <= result["device"]:
            node.fail("fail", f"rank {rank} sees {result['visible']} GPU(s), none for local rank {result['device']}")
        if result["uuid"] in uuids:
            node.fail("fail", f"ranks {uuids[result['uuid']]} and {rank} share one GPU ({result['uuid']})")
        uuids[result["uuid"]] = rank
    for key, _, _ in GPU_FIGURES:
        values = [(gpu[rank][key], rank) for rank in applicable if key in gpu[rank]]
        if values:
            node.figures[key], node.figure_ranks[key] = min(values)
    for part in ("node.all_reduce", "node.broadcast"):
        node.figures[part], node.best[part], _ = link(records, ranks, part)
    for op in ("all_reduce", "broadcast"):
        pairs = sorted({p for r in ranks for p in records[r]["results"] if p.startswith("pair.") and p.endswith(op)})
        measured = [link(records, ranks, pair)[:2] for pair in pairs]
        node.figures[f"pair.{op}"], node.best[f"pair.{op}"] = max(measured, default=(None, None))


def outliers(measured: dict) -> dict:
    """{who: (how far below, the median)} of those more than 10% below the median beyond noise."""
    if len(measured) < 2:
        return {}
    median = statistics.median(value for value, _ in measured.values())
    if median <= 0:
        return {}
    noise = statistics.median(1 - value / best if best else 0.0 for value, best in measured.values())
    below = {who: 1 - value / median for who, (value, _) in measured.items()}
    return {who: (far, median) for who, far in below.items() if far > max(1 - OUTLIER, noise)}


def flag_outliers(nodes: dict[str, Node], layout: Layout, records: dict[int, dict]) -> None:
    """Every GPU figure more than 10% below the median of all GPUs, every node figure below the nodes'."""
    gpus = gpu_results(records, list(records))
    for key, _, name in GPU_FIGURES:
        values = {rank: (gpu[key], gpu.get(f"{key}_best", gpu[key])) for rank, gpu in gpus.items() if key in gpu}
        for rank, (below, middle) in sorted(outliers(values).items()):
            node = nodes[layout.host(rank)]
            node.fail("slow", f"rank {rank}: {name} {values[rank][0]:.3g} is {below:.0%} below the median {middle:.3g}")
            node.evidence.append({"figure": name, "samples": {f"rank {rank}": gpus[rank].get(f"{key}_samples")}})
    for key, _, name in LINK_FIGURES[:2]:  # the node figures; the pairs' are judge_links'
        measured = {
            host: (node.figures[key], node.best[key]) for host, node in nodes.items() if node.figures[key] is not None
        }
        for host, (below, middle) in outliers(measured).items():
            node = nodes[host]
            node.fail("slow", f"{name} {measured[host][0]:.3g} GB/s is {below:.0%} below the median {middle:.3g}")
            samples = link(records, [rank for rank in node.ranks if rank in records], key)[2]
            node.evidence.append({"figure": name, "samples": {host: samples}})


@functools.cache  # the recursion reaches each (low, high, inverted) along many paths
def orders_at_most(low: int, high: int, inverted: int) -> int:
    """In how many orders of `low` among `high` values at most `inverted` pairs are out of order."""
    if inverted < 0:
        return 0
    if not low or not high:
        return 1
    return orders_at_most(low - 1, high, inverted - high) + orders_at_most(low, high - 1, inverted)


def noise_chance(own: list[float], reference: list[float]) -> float:
    """Chance that noise ranks `own` this far below `reference` (exact one-sided Mann-Whitney; a tie counts against)."""
    inverted = sum(a >= b for a in own for b in reference)
    return orders_at_most(len(own), len(reference), inverted) / math.comb(len(own) + len(reference), len(own))


def judge_links(nodes: dict[str, Node], records: dict[int, dict]) -> None:
    """A retested node is judged on its retests (judge_link); one with its best pair >10% below the median: suspect."""
    measured = retests(records)
    for key, _, name in LINK_FIGURES[2:]:
        op = key.split(".")[1]
        figures = {host: node.figures[key] for host, node in nodes.items() if node.figures.get(key) is not None}
        middle = statistics.median(figures.values()) if len(figures) > 2 else None
        for host, node in nodes.items():
            own = [m for m in measured if m["suspect"] == host and m["op"] == op]
            if own:
                judge_link(node, name.removeprefix("best "), own)
            elif middle is not None and host in figures and figures[host] < OUTLIER * middle:
                below = 1 - figures[host] / middle
                reason = f"{name} {figures[host]:.3g} GB/s is {below:.0%} below the median {middle:.3g} in one"
                node.fail("suspect", f"suspect, not excluded: {reason} measurement, not retested")


def retests(records: dict[int, dict]) -> list[dict]:
    """Every retest measurement of a pair, in the order measured (docs/health.md)."""
    measured: dict[tuple[str, tuple[int, ...]], dict] = {}
    for record in records.values():
        for part, result in record["results"].items():
            key = (part, tuple(result.get("ranks") or ()))
            if part.startswith("retest.") and "suspect" in result and key not in measured:
                figure = link(records, result["ranks"], part)[1]
                measured[key] = {k: result[k] for k in ("suspect", "role", "pair")}
                measured[key] |= {"op": part.rsplit(".", 1)[1], "figure": figure}
    return [measured[key] for key in sorted(measured, key=lambda key: (part_order(key[0]), key[1]))]


def judge_link(node: Node, name: str, measured: list[dict]) -> None:
    """Slow, suspect or ok by the retests' best samples against the reference pair's (docs/health.md, "Slow")."""
    own = [m["figure"] for m in measured if m["role"] != "reference"]
    reference = [m["figure"] for m in measured if m["role"] == "reference"]
    below = 1 - statistics.median(own) / statistics.median(reference)
    chance = noise_chance(own, reference)
    far = below > 1 - OUTLIER
    if chance > (SUSPECT_CHANCE if far else NOISE_CHANCE):
        return
    pair = "-".join(next(m["pair"] for m in measured if m["role"] == "reference"))
    partners = " and ".join(sorted({h for m in measured if m["role"] != "reference" for h in m["pair"]} - {node.host}))
    what = (
        f"{name} with {partners} {statistics.median(own):.3g} GB/s is {below:.0%} below {pair}'s"
        f" {statistics.median(reference):.3g} (the median best sample of {len(own)} and {len(reference)} retests)"
    )
    if far and chance <= NOISE_CHANCE:
        node.fail("slow", f"{what}; noise ranks them so in {chance:.2g} of checks")
    else:
        node.fail("suspect", f"suspect, not excluded: {what}, which noise does in {chance:.2g} of checks")
    samples: dict[str, list[float]] = {}
    for m in measured:
        samples.setdefault(" ".join(m["pair"]), []).append(m["figure"])
    label = "best sample of each retest, in order"
    node.evidence.append({"figure": name, "what": label, "samples": samples, "below": below, "noise_chance": chance})


def behind(part: str, members: list[int], records: dict[int, dict]) -> list[int]:
    """The unfinished members that never reached `part` (at the start: the rendezvous); a finished one passed all."""
    unfinished = [m for m in members if not records.get(m, {}).get("finished")]
    if part == "start":
        return [m for m in unfinished if records.get(m, {}).get("stage") != "rendezvous"]
    return [m for m in unfinished if part_order(records.get(m, {}).get("part") or "start") < part_order(part)]


def whereabouts(record: dict | None) -> str:
    if not record:
        return "no record: it never started"
    if (record.get("part") or "start") == "start":  # check.py's record has no part at the start
        return f"still at the start ({record.get('stage')})"
    return f"still in {describe(record['part'])}"


def blame(run: Run, nodes: dict[str, Node]) -> str:
    """Who a hang is on: a late rank's group members that never reached its part, else the group; job finding or ""."""
    records, layout, job = run.records, run.layout, ""
    for rank in run.late:
        part = records.get(rank, {}).get("part") or "start"
        members = records.get(rank, {}).get("group") or list(range(layout.world))
        stragglers = behind(part, members, records)
        for member in stragglers:
            state = whereabouts(records.get(member))
            nodes[layout.host(member)].fail("hang", f"rank {member} never reached {describe(part)}: {state}")
        if stragglers:
            waited = deadline(part, run.timeout)
            nodes[layout.host(rank)].fail("blocked", f"rank {rank} waited {waited:g} s in {describe(part)}")
            continue
        hosts = {layout.host(m) for m in members}
        what = f"{describe(part)} did not finish within {deadline(part, run.timeout):g} s (ranks {ranges(members)})"
        if part == "start" or 1 < len(hosts) == len(layout.hosts):
            job = f"{what}: every rank was in it, and no node outside it tells which one is at fault"
            continue
        for host in hosts:
            nodes[host].fail("hang", what)
    return job


def judge(run: Run) -> tuple[list[Node], str]:
    """The nodes with their figures and verdicts, and a finding about the job as a whole ("" when none)."""
    records, layout = run.records, run.layout
    nodes = {host: Node(host, layout.ranks(host)) for host in layout.hosts}
    for node in nodes.values():
        fill_figures(node, records)
    for rank, record in sorted(records.items()):
        if record.get("error"):
            reason = f"rank {rank}: {describe(record['part'] or 'start')}: {record['error']}"
            nodes[layout.host(rank)].fail("fail", reason)
    for rank, status in sorted(exit_statuses(run.run_dir, layout.world).items()):
        if status not in ENDED_WELL and not records.get(rank, {}).get("error"):
            nodes[layout.host(rank)].fail("fail", f"rank {rank} exited with status {status}")
    job = blame(run, nodes) if run.outcome == "deadline" else ""
    if run.outcome == "stopped":
        job = "the check was stopped before it finished"
    elif run.outcome == "exited" and not any(node.failed for node in nodes.values()):
        job = f"the launch ended before every rank finished: see {run.run_dir / LAUNCHER_LOG}"
    for rank in range(layout.world):
        node = nodes[layout.host(rank)]
        if not records.get(rank, {}).get("finished") and node.verdict == "ok":
            node.fail("blocked", f"rank {rank} did not finish: the check stopped")
    if run.outcome == "finished":
        flag_outliers(nodes, layout, records)
        judge_links(nodes, records)
    return list(nodes.values()), job
