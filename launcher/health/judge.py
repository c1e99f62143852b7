"""The verdict on every node of a health check, from the ranks' records. A node fails when a GPU or node figure of it
is more than 10% below the job's median (and further than the job's samples typically spread), when its retests show
its link slow beyond noise (judge_link), when a rank of it reports an error, or when the check hangs there: a rank
that stays in one part longer than the deadline is stuck, and the blame goes to the members of its group that never
reached that part, else to the group itself (its node, or its pair of nodes). A node whose link may be slow, but not
beyond noise, is "suspect": named with its figures, not excluded. Standard library only (the launching host may have
no SciPy: the rank test is a few lines here)."""

from __future__ import annotations

import dataclasses
import statistics

from launcher.health.records import (
    Layout,
    Run,
    deadline,
    describe,
    exit_statuses,
    link_figures,
    link_samples,
    part_order,
    ranges,
    retests,
)

OUTLIER = 0.9  # a figure below 90% of the job's median is an outlier
NOISE_CHANCE = 0.001  # a link is condemned when noise would rank its retests so in at most 1 check of 1,000
SUSPECT_CHANCE = 0.05  # and is suspect, when low, at 1 in 20: what noise does more often is no finding
GPU_FIGURES = (
    ("free_gib", "free GiB", "free memory"),
    ("matmul_tflops", "matmul TF/s", "bf16 matmul"),
    ("hbm_tb_s", "HBM TB/s", "HBM copy"),
)
LINK_FIGURES = (
    ("node.all_reduce", "node AR", "node all-reduce"),
    ("node.broadcast", "node BC", "node broadcast"),
    ("pair.all_reduce", "pair AR", "best pair all-reduce"),
    ("pair.broadcast", "pair BC", "best pair broadcast"),
)
STOPPED_STATUSES = {"130", "137", "143"}
VERDICTS = ("ok", "suspect", "blocked", "slow", "fail", "hang")  # worse verdicts win


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
        if VERDICTS.index(verdict) > VERDICTS.index(self.verdict):
            self.verdict = verdict
        self.reasons.append(reason)

    @property
    def failed(self) -> bool:
        return self.verdict in ("slow", "fail", "hang")


def gpu_results(records: dict[int, dict], ranks: list[int]) -> dict[int, dict]:
    """The GPU part's result of each of `ranks` that has a record ({} for one without the part)."""
    return {rank: records[rank]["results"].get("gpu") or {} for rank in ranks if rank in records}


def fill_figures(node: Node, records: dict[int, dict]) -> None:
    """The node's figures: each GPU figure of its worst GPU, its own collectives' figures, and those of its best
    pair (so that a bad partner drags only itself)."""
    ranks = [rank for rank in node.ranks if rank in records]
    gpu = gpu_results(records, ranks)
    applicable = [rank for rank in ranks if gpu[rank].get("applicable")]
    if applicable:
        node.gpus = f"{len(applicable)}/{len(node.ranks)}"
    for key, _, _ in GPU_FIGURES:
        values = [(gpu[rank][key], rank) for rank in applicable if key in gpu[rank]]
        if values:
            node.figures[key], node.figure_ranks[key] = min(values)
    for part in ("node.all_reduce", "node.broadcast"):
        node.figures[part], node.best[part] = link_figures(records, ranks, part)
    for op in ("all_reduce", "broadcast"):
        pairs = sorted({p for r in ranks for p in records[r]["results"] if p.startswith("pair.") and p.endswith(op)})
        measured = [link_figures(records, ranks, pair) for pair in pairs]
        measured = [figures for figures in measured if figures[0] is not None]
        node.figures[f"pair.{op}"], node.best[f"pair.{op}"] = max(measured) if measured else (None, None)


def check_gpus(node: Node, records: dict[int, dict]) -> None:
    uuids: dict[str, int] = {}
    for rank, result in gpu_results(records, node.ranks).items():
        if not result.get("applicable"):
            continue
        if result["visible"] <= result["device"]:
            node.fail("fail", f"rank {rank} sees {result['visible']} GPU(s), none for local rank {result['device']}")
        if result["uuid"] in uuids:
            node.fail("fail", f"ranks {uuids[result['uuid']]} and {rank} share one GPU ({result['uuid']})")
        uuids[result["uuid"]] = rank


def spread(value: float, best: float) -> float:
    """How far a figure's median sample lies below its best one: the measurement's own noise."""
    return 1 - value / best if best else 0.0


def outlier(value: float, median: float, noise: float) -> float | None:
    """How far below the job's `median` `value` is, when that is more than 10% and more than `noise`, how far the
    job's samples typically spread (noise is no outlier: on GPUs samples agree to a few percent, gloo on a shared
    CPU's do not); else None. A median of 0 (most GPUs with no memory free) leaves nothing to be below."""
    if median <= 0:
        return None
    below = 1 - value / median
    return below if below > max(1 - OUTLIER, noise) else None


def outliers(measured: dict) -> dict:
    """{who: (how far below, the median)} of the figures {who: (median sample, best sample)} that are outliers."""
    if len(measured) < 2:
        return {}
    median = statistics.median(value for value, _ in measured.values())
    noise = statistics.median(spread(*figures) for figures in measured.values())
    found = {who: outlier(value, median, noise) for who, (value, _) in measured.items()}
    return {who: (below, median) for who, below in found.items() if below is not None}


def flag_outliers(nodes: list[Node], records: dict[int, dict]) -> None:
    """Every figure more than 10% below the job's median: per GPU among all GPUs, per node among the nodes."""
    gpus = gpu_results(records, list(records))
    for key, _, name in GPU_FIGURES:
        values = {rank: (gpu[key], gpu.get(f"{key}_best", gpu[key])) for rank, gpu in gpus.items() if key in gpu}
        slow = outliers(values)
        for node in nodes:
            for rank in (rank for rank in node.ranks if rank in slow):
                (below, middle), value = slow[rank], values[rank][0]
                node.fail("slow", f"rank {rank}: {name} {value:.3g} is {below:.0%} below the median {middle:.3g}")
                node.evidence.append({"figure": name, "samples": {f"rank {rank}": gpus[rank].get(f"{key}_samples")}})
    for key, _, name in LINK_FIGURES[:2]:  # the node figures; the pairs' are judge_links'
        measured = {
            node.host: (node.figures[key], node.best[key]) for node in nodes if node.figures.get(key) is not None
        }
        slow = outliers(measured)
        for node in (node for node in nodes if node.host in slow):
            (below, middle), value = slow[node.host], measured[node.host][0]
            node.fail("slow", f"{name} {value:.3g} GB/s is {below:.0%} below the median {middle:.3g}")
            samples = {node.host: link_samples(records, [r for r in node.ranks if r in records], key)}
            node.evidence.append({"figure": name, "samples": samples})
    judge_links(nodes, records)


def arrangements(low: int, high: int) -> list[int]:
    """For u = 0, 1, ...: in how many of the C(low + high, low) orders of `low` values among `high` others exactly u
    (low value, high value) pairs are out of order; the coefficients of the Gaussian binomial [low + high, low]."""
    counts = [1] + [0] * (low * high + low)
    for i in range(1, low + 1):  # times (1 - q^(high + i)) / (1 - q^i)
        for u in range(len(counts) - 1, high + i - 1, -1):
            counts[u] -= counts[u - high - i]
        for u in range(i, len(counts)):
            counts[u] += counts[u - i]
    return counts[: low * high + 1]


def noise_chance(own: list[float], reference: list[float]) -> float:
    """The chance that measurements of one link, all alike, rank `own` at least as far below `reference` as they
    are (the exact one-sided Mann-Whitney test; a tie counts against the verdict)."""
    inverted = sum(1 for a in own for b in reference if a >= b)
    counts = arrangements(len(own), len(reference))
    return sum(counts[: inverted + 1]) / sum(counts)


def judge_links(nodes: list[Node], records: dict[int, dict]) -> None:
    """A node whose retests were measured is judged on them (judge_link). One not retested whose best pair is more
    than 10% below the nodes' median is suspect."""
    measured = retests(records)
    for key, _, name in LINK_FIGURES[2:]:
        op = key.split(".")[1]
        figures = {node.host: node.figures[key] for node in nodes if node.figures.get(key) is not None}
        middle = statistics.median(figures.values()) if len(figures) > 2 else None
        for node in nodes:
            own = [m for m in measured if m["suspect"] == node.host and m["op"] == op]
            flagged = middle is not None and node.host in figures and figures[node.host] < OUTLIER * middle
            if own:
                judge_link(node, name.removeprefix("best "), own)
            elif flagged:
                below = 1 - figures[node.host] / middle
                reason = f"{name} {figures[node.host]:.3g} GB/s is {below:.0%} below the median {middle:.3g} in one"
                node.fail("suspect", f"suspect, not excluded: {reason} measurement, not retested")


def judge_link(node: Node, name: str, measured: list[dict]) -> None:
    """Slow when the best samples of the node's pairs (with the same partner and another) are more than 10% below
    the reference pair's (those two partners) and noise would rank them so in at most NOISE_CHANCE of checks;
    suspect when they are that far below and noise would rank them so in at most SUSPECT_CHANCE, or when noise
    would not but they are less far below; else ok (the first figure was noise)."""
    own = [m["figure"] for m in measured if m["role"] != "reference"]
    reference = [m["figure"] for m in measured if m["role"] == "reference"]
    below = 1 - statistics.median(own) / statistics.median(reference)
    chance = noise_chance(own, reference)
    far = below > 1 - OUTLIER
    if (far and chance > SUSPECT_CHANCE) or (not far and chance > NOISE_CHANCE):
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
    samples: dict[str, list[float]] = {" ".join(m["pair"]): [] for m in measured}
    for m in measured:
        samples[" ".join(m["pair"])].append(m["figure"])
    label = "best sample of each retest, in order"
    node.evidence.append({"figure": name, "what": label, "samples": samples, "below": below, "noise_chance": chance})


def behind(part: str, members: list[int], records: dict[int, dict]) -> list[int]:
    """The members of a group, not finished, that never reached `part` (at the start: never reached the rendezvous).
    A finished member went through every part (its record has no part any more: a broadcast's root is done early)."""
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


def blame(late: list[int], records: dict[int, dict], layout: Layout, nodes: dict[str, Node], timeout: float) -> str:
    """Name who a hang is on: for each rank past its part's deadline, the members of its group that never reached that
    part, else the group itself. Returns a job-wide finding when no node is to blame."""
    job = ""
    for rank in late:
        record = records.get(rank, {})
        part = record.get("part") or "start"
        members = record.get("group") or list(range(layout.world))
        stragglers = behind(part, members, records)
        for member in stragglers:
            state = whereabouts(records.get(member))
            nodes[layout.host(member)].fail("hang", f"rank {member} never reached {describe(part)}: {state}")
        if stragglers:
            waited = deadline(part, timeout)
            nodes[layout.host(rank)].fail("blocked", f"rank {rank} waited {waited:g} s in {describe(part)}")
            continue
        hosts = sorted({layout.host(m) for m in members}, key=layout.index.__getitem__)
        what = f"{describe(part)} did not finish within {deadline(part, timeout):g} s (ranks {ranges(members)})"
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
        check_gpus(node, records)
    for rank, record in sorted(records.items()):
        if record.get("error"):
            reason = f"rank {rank}: {describe(record['part'] or 'start')}: {record['error']}"
            nodes[layout.host(rank)].fail("fail", reason)
    for rank, status in sorted(exit_statuses(run.run_dir, layout.world).items()):
        if status not in STOPPED_STATUSES | {"0"} and not records.get(rank, {}).get("error"):
            nodes[layout.host(rank)].fail("fail", f"rank {rank} exited with status {status}")
    job = blame(run.late, records, layout, nodes, run.timeout) if run.outcome == "deadline" else ""
    if run.outcome == "stopped":
        job = "the check was stopped before it finished"
    elif run.outcome == "exited" and not any(node.failed for node in nodes.values()):
        job = f"the launch ended before every rank finished: see {run.run_dir / 'logs' / 'launcher.log'}"
    for rank in range(layout.world):
        node = nodes[layout.host(rank)]
        if not records.get(rank, {}).get("finished") and node.verdict == "ok":
            node.fail("blocked", f"rank {rank} did not finish: the check stopped")
    if run.outcome == "finished":
        flag_outliers(list(nodes.values()), records)
    return list(nodes.values()), job
