"""srun.sh's health check, on the launching host: run the check's launch (every rank runs launcher/health.py), stop
it when a rank is stuck in a part past its deadline, and turn the ranks' records into one table on the console and
RUN_DIR/health.json: node, ranks, each figure, a verdict, and every outlier named with what to do.

    python3 launcher/health_report.py RUN_DIR --timeout S --nodes HOST,... --ranks-per-node G -- LAUNCH...

The table goes to stdout.
Exit status 0 when every node passes, 1 otherwise; RUN_DIR/health/failed-nodes then lists the nodes to exclude
(a batch job with SRUNSH_HEALTH=1 excludes them before it requeues itself). A node fails when a GPU or node figure
of it is more than 10% below the job's median (and further than the job's samples typically spread), when its
retests show its link slow beyond noise (see judge_link), when a rank of it reports an error, or when the check
hangs there: a rank that stays in one part longer than the deadline is stuck, and the blame goes to the members of
its group that never reached that part, else to the group itself (its node, or its pair of nodes). A node whose link
may be slow, but not beyond noise, is "suspect": named with its figures, not excluded. Standard library only (the
launching host may have no SciPy: the rank test is a few lines here).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

OUTLIER = 0.9  # a figure below 90% of the job's median is an outlier
NOISE_CHANCE = 0.001  # a link is condemned when noise would rank its retests so in at most 1 check of 1,000
SUSPECT_CHANCE = 0.05  # and is suspect, when low, at 1 in 20: what noise does more often is no finding
POLL_S = 0.5
STOP_GRACE_S = 60.0
GPU_FIGURES = (("free_gib", "free GiB", "free memory"), ("matmul_tflops", "matmul TF/s", "bf16 matmul"))
GPU_FIGURES += (("hbm_tb_s", "HBM TB/s", "HBM copy"),)
LINK_FIGURES = (("node.all_reduce", "node AR", "node all-reduce"), ("node.broadcast", "node BC", "node broadcast"))
LINK_FIGURES += (
    ("pair.all_reduce", "pair AR", "best pair all-reduce"),
    ("pair.broadcast", "pair BC", "best pair broadcast"),
)
STOPPED_STATUSES = {"130", "137", "143"}
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
START_FACTOR = 3  # the start (container, python, torch import, rendezvous) may take this many deadlines


class StopRequestedError(Exception):
    """srun.sh was stopped (SIGINT/SIGTERM) while the check ran."""


def on_stop(signum: int, _frame: object) -> None:
    raise StopRequestedError(signal.Signals(signum).name)


@dataclasses.dataclass
class Layout:
    hosts: list[str]  # in rank order
    per_node: int

    @property
    def world(self) -> int:
        return len(self.hosts) * self.per_node

    def host(self, rank: int) -> str:
        return self.hosts[rank // self.per_node]

    def ranks(self, host: str) -> list[int]:
        first = self.hosts.index(host) * self.per_node
        return list(range(first, first + self.per_node))


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
        """Worse verdicts win: hang and fail over slow, slow over blocked, blocked over suspect, suspect over ok."""
        order = ["ok", "suspect", "blocked", "slow", "fail", "hang"]
        if order.index(verdict) > order.index(self.verdict):
            self.verdict = verdict
        self.reasons.append(reason)

    @property
    def failed(self) -> bool:
        return self.verdict in ("slow", "fail", "hang")


def ranges(ranks: list[int]) -> str:
    ordered = sorted(ranks)
    if ordered and ordered == list(range(ordered[0], ordered[-1] + 1)) and len(ordered) > 1:
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(str(rank) for rank in ordered)


# ---- Running the check ------------------------------------------------------------------------------------------


def read_records(health: Path, world: int, known: dict[int, dict] | None = None) -> dict[int, dict]:
    """Every rank's record; a finished one in `known` is not read again (a poll of 4,096 files on a shared file
    system is not free)."""
    records = {rank: record for rank, record in (known or {}).items() if record["finished"]}
    for rank in range(world):
        if rank in records:
            continue
        try:
            records[rank] = json.loads((health / f"rank-{rank}.json").read_text())
        except (OSError, ValueError):
            continue  # not written yet, or being replaced: the next poll reads it
    return records


def supervise(process: subprocess.Popen, health: Path, world: int, timeout: float) -> tuple[str, list[int]]:
    """Until every rank finished ("finished"), the launch ended first ("exited"), or ranks overstayed a part's
    deadline ("deadline", those ranks). A part's clock starts when this host first sees a rank in it (the start's
    at the launch), so the clocks of other hosts never matter."""
    started = time.monotonic()
    seen: dict[int, tuple[str, float]] = {}
    records: dict[int, dict] = {}
    while True:
        records = read_records(health, world, records)
        now = time.monotonic()
        if len(records) == world and all(record["finished"] for record in records.values()):
            return "finished", []
        if process.poll() is not None:
            return "exited", []
        late = []
        for rank in range(world):
            record = records.get(rank, {})
            if record.get("finished"):
                continue
            part = record.get("part") or "start"
            if seen.get(rank, ("", 0.0))[0] != part:
                seen[rank] = (part, started if part == "start" else now)
            if now - seen[rank][1] > deadline(part, timeout):
                late.append(rank)
        if late:
            return "deadline", late
        time.sleep(POLL_S)


def deadline(part: str, timeout: float) -> float:
    return START_FACTOR * timeout if part == "start" else timeout


def stop(process: subprocess.Popen, finishing: bool) -> None:
    """SIGTERM to the launch (srun passes it to every rank, then SIGKILL after KillWait; torchrun likewise), unless
    its ranks have finished and it ends by itself."""
    if finishing:
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass  # stopped below
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def exit_statuses(run_dir: Path, world: int) -> dict[int, str]:
    """How each rank ended, from launcher/rank.sh's RUN_DIR/logs/rank-R.status."""
    statuses = {}
    for rank in range(world):
        try:
            statuses[rank] = (run_dir / "logs" / f"rank-{rank}.status").read_text().split()[0]
        except (OSError, IndexError):
            continue
    return statuses


# ---- Judging the records ----------------------------------------------------------------------------------------


def largest(bandwidth: dict[str, float]) -> float | None:
    return bandwidth[max(bandwidth, key=int)] if bandwidth else None


def part_order(part: str) -> tuple[int, int, int]:
    """Where a part comes in every rank's sequence (start, gpu, node, pair rounds, job)."""
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


def part_results(records: dict[int, dict], ranks: list[int], part: str) -> list[dict]:
    """The results of a collective part on every member of the group that the first of `ranks` in it was in."""
    group = next((records[r]["results"][part]["ranks"] for r in ranks if part in records[r]["results"]), [])
    return [records[rank]["results"][part] for rank in group if part in records.get(rank, {}).get("results", {})]


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


def fill_figures(node: Node, records: dict[int, dict]) -> None:
    """The node's figures: each GPU figure of its worst GPU, its own collectives' figures, and those of its best
    pair (so that a bad partner drags only itself)."""
    ranks = [rank for rank in node.ranks if rank in records]
    gpu = {rank: records[rank]["results"].get("gpu") or {} for rank in ranks}
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
    for rank in node.ranks:
        result = records.get(rank, {}).get("results", {}).get("gpu")
        if not result or not result.get("applicable"):
            continue
        if result["visible"] <= result["device"]:
            node.fail("fail", f"rank {rank} sees {result['visible']} GPU(s), none for local rank {result['device']}")
        if result["uuid"] in uuids:
            node.fail("fail", f"ranks {uuids[result['uuid']]} and {rank} share one GPU ({result['uuid']})")
        uuids[result["uuid"]] = rank


def spread(value: float, best: float) -> float:
    """How far a figure's median sample lies below its best one: the measurement's own noise."""
    return 1 - value / best if best else 0.0


def outlier(value: float, values: list[float], spreads: list[float]) -> float | None:
    """How far below the job's median `value` is, when that is more than 10% and more than the job's samples
    typically spread (noise is no outlier: on GPUs samples agree to a few percent, gloo on a shared CPU's do not);
    else None. A median of 0 (most GPUs with no memory free) leaves nothing to be below."""
    median = statistics.median(values)
    if median <= 0:
        return None
    below = 1 - value / median
    return below if below > max(1 - OUTLIER, statistics.median(spreads)) else None


def outliers(measured: dict) -> dict:
    """{who: (how far below, the median)} of the figures {who: (median sample, best sample)} that are outliers."""
    if len(measured) < 2:
        return {}
    medians, spreads = [v for v, _ in measured.values()], [spread(*figures) for figures in measured.values()]
    found = {who: outlier(value, medians, spreads) for who, (value, _) in measured.items()}
    return {who: (below, statistics.median(medians)) for who, below in found.items() if below is not None}


def flag_outliers(nodes: list[Node], records: dict[int, dict]) -> None:
    """Every figure more than 10% below the job's median: per GPU among all GPUs, per node among the nodes."""
    gpus = {rank: record["results"].get("gpu") or {} for rank, record in records.items()}
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


def retests(records: dict[int, dict]) -> list[dict]:
    """Every retest measurement of a pair (launcher/health.py): suspect, role (same, other, reference), pair, op,
    its figure (the slowest member's best sample: noise only slows a sample, a capped link caps every one) and its
    samples."""
    measured: dict[tuple[str, tuple[int, ...]], dict] = {}
    for record in records.values():
        for part, result in record["results"].items():
            key = (part, tuple(result.get("ranks", ())))
            if not part.startswith("retest.") or "suspect" not in result or key in measured:
                continue
            figure = link_figures(records, result["ranks"], part)[1]
            measured[key] = {**{k: result[k] for k in ("suspect", "role", "pair")}, "op": part.rsplit(".", 1)[1]}
            measured[key] |= {"figure": figure, "samples": link_samples(records, result["ranks"], part)}
    in_order = sorted(measured, key=lambda key: (part_order(key[0]), key[1]))  # as measured
    return [measured[key] for key in in_order]


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
    """A node whose retests were measured is judged on them: slow when the best samples of its pairs (with the same
    partner and another) are more than 10% below the reference pair's (those two partners) and noise would rank them
    so in at most NOISE_CHANCE of checks; suspect when they are that far below and noise would rank them so in at most
    SUSPECT_CHANCE, or when noise would not but they are less far below; else ok (the first figure was noise). One
    not retested whose best pair is more than 10% below the nodes' median is suspect."""
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
    samples = {" ".join(m["pair"]): [] for m in measured}
    for m in measured:
        samples[" ".join(m["pair"])].append(m["figure"])
    label = "best sample of each retest, in order"
    node.evidence.append({"figure": name, "what": label, "samples": samples, "below": below, "noise_chance": chance})


def blame(late: list[int], records: dict[int, dict], layout: Layout, nodes: dict[str, Node], timeout: float) -> str:
    """Name who a hang is on: for each rank past its part's deadline, the members of its group that never reached that
    part, else the group itself. Returns a job-wide finding when no node is to blame."""
    job = ""
    for rank in late:
        record = records.get(rank, {})
        part = record.get("part") or "start"
        members = record.get("group") or list(range(layout.world))
        # A finished member went through every part (its record has no part any more: a broadcast's root is done
        # early).
        unfinished = [m for m in members if not records.get(m, {}).get("finished")]
        if part == "start":
            behind = [m for m in unfinished if records.get(m, {}).get("stage") != "rendezvous"]
        else:
            behind = [m for m in unfinished if part_order(records.get(m, {}).get("part") or "start") < part_order(part)]
        for member in behind:
            where = records.get(member)
            if not where:
                state = "no record: it never started"
            elif (where.get("part") or "start") == "start":  # launcher/health.py's record has no part at the start
                state = f"still at the start ({where.get('stage')})"
            else:
                state = f"still in {describe(where['part'])}"
            nodes[layout.host(member)].fail("hang", f"rank {member} never reached {describe(part)}: {state}")
        if behind:
            waited = deadline(part, timeout)
            nodes[layout.host(rank)].fail("blocked", f"rank {rank} waited {waited:g} s in {describe(part)}")
            continue
        hosts = sorted({layout.host(m) for m in members}, key=layout.hosts.index)
        what = f"{describe(part)} did not finish within {deadline(part, timeout):g} s (ranks {ranges(members)})"
        if part == "start" or 1 < len(hosts) == len(layout.hosts):
            job = f"{what}: every rank was in it, and no node outside it tells which one is at fault"
            continue
        for host in hosts:
            nodes[host].fail("hang", what)
    return job


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


# ---- Telling the user -------------------------------------------------------------------------------------------


def number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}" if value < 100 else f"{value:.0f}"


def table(nodes: list[Node]) -> list[str]:
    rows = [["node", "ranks", "GPUs", *(label for _, label, _ in GPU_FIGURES + LINK_FIGURES), "verdict"]]
    for node in nodes:
        figures = [number(node.figures.get(key)) for key, _, _ in GPU_FIGURES + LINK_FIGURES]
        rows.append([node.host, ranges(node.ranks), node.gpus, *figures, node.verdict.upper()])
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return ["  ".join(row[column].ljust(widths[column]) for column in range(len(row))).rstrip() for row in rows]


def job_figures(records: dict[int, dict]) -> dict[str, float | None]:
    ranks = list(records)
    return {op: link_figures(records, ranks, f"job.{op}")[0] for op in ("all_reduce", "broadcast")}


def console(run: Run, nodes: list[Node], job: str) -> list[str]:
    records, layout, results = run.records, run.layout, run.run_dir / "health.json"
    backends = {r["results"]["start"]["backend"] for r in records.values() if "start" in r["results"]}
    over = f" over {', '.join(sorted(backends))}" if backends else ""
    sizes = sorted({int(s) for r in records.values() for p in r["results"].values() for s in p.get("busbw_gb_s", {})})
    at = f" at {sizes[-1] / 2**20:g} MiB" if sizes else ""
    lines = [
        f"srun.sh: health check of {len(layout.hosts)} node(s) x {layout.per_node} rank(s){over},"
        f" {run.seconds:.1f} s; bus bandwidth in GB/s{at} (pair: the best partner's)",
        *table(nodes),
    ]
    figures = job_figures(records)
    if any(value is not None for value in figures.values()):
        all_reduce, broadcast = number(figures["all_reduce"]), number(figures["broadcast"])
        lines.append(f"job ({layout.world} ranks): all-reduce {all_reduce} GB/s, broadcast {broadcast} GB/s")
    for node in nodes:
        fix = f": exclude it: --exclude={node.host}" if node.failed else ""
        lines += [f"srun.sh: {node.host}: {reason}{fix}" for reason in node.reasons]
        lines += [f"srun.sh: {node.host}:   {line}" for line in evidence_lines(node)]
    if job:
        lines.append(f"srun.sh: the job: {job}")
    failed = ",".join(node.host for node in nodes if node.failed)
    if failed:
        count = len(failed.split(","))
        lines.append(
            f"srun.sh: health check failed on {count} of {len(nodes)} node(s): {failed}"
            f" (salloc/sbatch --exclude={failed}); {results}"
        )
    elif job:
        lines.append(f"srun.sh: health check failed; {results}")
    else:
        suspect = [node.host for node in nodes if node.verdict == "suspect"]
        but = f", {','.join(suspect)} suspect (not excluded: run the check again)" if suspect else ""
        lines.append(f"srun.sh: health check passed on all {len(nodes)} node(s){but}; {results}")
    return lines


def evidence_lines(node: Node) -> list[str]:
    """The samples of each flagged figure, as they were measured: GB/s (TF/s, TB/s for a GPU's)."""
    lines = []
    for evidence in node.evidence:
        parts = [
            f"{where} {' '.join(number(v) for v in values or [])}" for where, values in evidence["samples"].items()
        ]
        lines.append(f"{evidence['figure']} {evidence.get('what', 'samples')}: " + "; ".join(parts))
    return lines


def write_results(run: Run, nodes: list[Node], job: str) -> bool:
    failed = [node.host for node in nodes if node.failed]
    passed = not failed and not job
    result = {
        "passed": passed,
        "outcome": run.outcome,
        "seconds": round(run.seconds, 1),
        "timeout_s": run.timeout,
        "failed_nodes": failed,
        "suspect_nodes": [node.host for node in nodes if node.verdict == "suspect"],
        "job": {**job_figures(run.records), "finding": job or None},
        "nodes": [dataclasses.asdict(node) for node in nodes],
        "ranks": {str(rank): record for rank, record in sorted(run.records.items())},
    }
    (run.run_dir / "health.json").write_text(json.dumps(result, indent=1) + "\n")
    (run.run_dir / "health" / "failed-nodes").write_text(",".join(failed) + ("\n" if failed else ""))
    return passed


def check(args: argparse.Namespace) -> int:
    health = args.run_dir / "health"
    shutil.rmtree(health, ignore_errors=True)
    health.mkdir(parents=True)
    layout = Layout(args.nodes.split(","), args.ranks_per_node)
    for signum in STOP_SIGNALS:
        signal.signal(signum, on_stop)
    started = time.monotonic()
    process = subprocess.Popen(args.launch)
    outcome, late = "stopped", []
    try:
        outcome, late = supervise(process, health, layout.world, args.timeout)
    except StopRequestedError:
        pass  # outcome stays "stopped"
    finally:
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)  # the stop below must not be cut short
        stop(process, finishing=outcome == "finished")
    seconds = time.monotonic() - started
    run = Run(args.run_dir, layout, read_records(health, layout.world), outcome, late, args.timeout, seconds)
    nodes, job = judge(run)
    print("\n".join(console(run, nodes, job)), flush=True)  # stdout: the result, as a launch's is the ranks' output
    return 0 if write_results(run, nodes, job) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--timeout", type=float, required=True, help="seconds each part may take on a rank")
    parser.add_argument("--nodes", required=True, help="the job's hosts in rank order, comma-separated")
    parser.add_argument("--ranks-per-node", type=int, required=True)
    argv = sys.argv[1:]
    if "--" not in argv:
        if {"-h", "--help"} & set(argv):  # asks for no check: no launch command needed
            parser.print_help()
            parser.exit()
        parser.error("the launch command comes after --")
    args = parser.parse_args(argv[: argv.index("--")])
    args.launch = argv[argv.index("--") + 1 :]
    return check(args)


if __name__ == "__main__":
    raise SystemExit(main())
