"""A health check's verdicts for the user: the console's table and lines (every outlier named with what to do), and
RUN_DIR/health.json with RUN_DIR/health/failed-nodes (the nodes a batch job excludes)."""

from __future__ import annotations

import dataclasses
import json

from launcher.health.judge import GPU_FIGURES, LINK_FIGURES, Node
from launcher.health.records import Run, link_figures, ranges

FIGURES = GPU_FIGURES + LINK_FIGURES


def number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}" if value < 100 else f"{value:.0f}"


def table(nodes: list[Node]) -> list[str]:
    rows = [["node", "ranks", "GPUs", *(label for _, label, _ in FIGURES), "verdict"]]
    for node in nodes:
        figures = [number(node.figures.get(key)) for key, _, _ in FIGURES]
        rows.append([node.host, ranges(node.ranks), node.gpus, *figures, node.verdict.upper()])
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return ["  ".join(row[column].ljust(widths[column]) for column in range(len(row))).rstrip() for row in rows]


def job_figures(records: dict[int, dict]) -> dict[str, float | None]:
    ranks = list(records)
    return {op: link_figures(records, ranks, f"job.{op}")[0] for op in ("all_reduce", "broadcast")}


def console(run: Run, nodes: list[Node], job: str) -> list[str]:
    records, layout = run.records, run.layout
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
    return [*lines, verdict_line(run, nodes, job)]


def verdict_line(run: Run, nodes: list[Node], job: str) -> str:
    results = run.run_dir / "health.json"
    failed = [node.host for node in nodes if node.failed]
    if failed:
        hosts = ",".join(failed)
        return (
            f"srun.sh: health check failed on {len(failed)} of {len(nodes)} node(s): {hosts}"
            f" (salloc/sbatch --exclude={hosts}); {results}"
        )
    if job:
        return f"srun.sh: health check failed; {results}"
    suspect = [node.host for node in nodes if node.verdict == "suspect"]
    but = f", {','.join(suspect)} suspect (not excluded: run the check again)" if suspect else ""
    return f"srun.sh: health check passed on all {len(nodes)} node(s){but}; {results}"


def evidence_lines(node: Node) -> list[str]:
    """The samples of each flagged figure, as they were measured: GB/s (TF/s, TB/s for a GPU's)."""
    lines = []
    for evidence in node.evidence:
        samples = evidence["samples"].items()
        parts = [f"{where} {' '.join(number(v) for v in values or [])}" for where, values in samples]
        lines.append(f"{evidence['figure']} {evidence.get('what', 'samples')}: " + "; ".join(parts))
    return lines


def record_text(record: dict) -> str:
    """A rank's record as it wrote it (check.py's Record writes one line of json.dumps), else encoded."""
    text = getattr(record, "text", "")
    return text if text and "\n" not in text else json.dumps(record)


def results_text(result: dict) -> str:
    """health.json's text: the verdicts indented, each rank's record on a line of its own (json's indenting encoder,
    pure Python, takes 15 s for the records of 4,096 ranks; its C encoder writes each line at once)."""
    head = json.dumps({key: value for key, value in result.items() if key != "ranks"}, indent=1).removesuffix("\n}")
    ranks = ",\n".join(f"  {json.dumps(rank)}: {record_text(record)}" for rank, record in result["ranks"].items())
    return f'{head},\n "ranks": {{\n{ranks}\n }}\n}}\n'


def write_results(run: Run, nodes: list[Node], job: str) -> bool:
    """Writes RUN_DIR/health.json and RUN_DIR/health/failed-nodes; whether every node passed."""
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
    (run.run_dir / "health.json").write_text(results_text(result))
    (run.run_dir / "health" / "failed-nodes").write_text(",".join(failed) + ("\n" if failed else ""))
    return passed
