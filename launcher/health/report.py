"""srun.sh's health check, on the launching host: run the check's launch, stop it when a rank is stuck in a part
past its deadline, and judge the ranks' records into one table on stdout and RUN_DIR/health.json (docs/health.md).

    python3 launcher/health/report.py RUN_DIR --timeout S --nodes HOST,... --ranks-per-node G -- LAUNCH...

Exit status 0 when every node passes, 1 otherwise; RUN_DIR/health/failed-nodes then lists the nodes to exclude.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

if not __package__:  # run as a script: the repository, two folders up, holds the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from launcher.health.judge import GPU_FIGURES, LINK_FIGURES, Layout, Node, Run, deadline, judge, link, ranges
from launcher.run_files import FAILED_NODES, HEALTH_JSON, many_records, remove_tree

POLL_S = 0.5
STOP_GRACE_S = 60.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
FIGURES = GPU_FIGURES + LINK_FIGURES
Records = dict[int, dict]


class RankRecord(dict):
    """A rank's record, and the line it was read from, which health.json repeats (docs/health.md)."""

    text: str = ""  # none for a record of more than one line


def read_records(health: Path, world: int, known: Records | None = None) -> Records:
    """Every rank's record; a finished one in `known` is not read again (a poll of 4,096 files on a shared FS costs)."""
    records = {rank: record for rank, record in (known or {}).items() if record["finished"]}
    for rank in (rank for rank in range(world) if rank not in records):
        with contextlib.suppress(OSError, ValueError):  # not written yet, or being replaced: the next poll reads it
            text = (health / f"rank-{rank}.json").read_text()
            records[rank] = RankRecord(json.loads(text))
            records[rank].text = "" if "\n" in text else text
    return records


def supervise(process: subprocess.Popen, health: Path, world: int, timeout: float) -> tuple[str, list[int], Records]:
    """Until every rank finished, the launch ended, or ranks overstayed a part's deadline (docs/health.md)."""
    started = time.monotonic()
    seen: dict[int, tuple[str, float]] = {}
    records: Records = {}
    while True:
        ended = process.poll() is not None  # before the read: a rank that finished before the end is in it
        records = read_records(health, world, records)
        now = time.monotonic()
        if len(records) == world and all(record["finished"] for record in records.values()):
            return "finished", [], records
        if ended:
            return "exited", [], records
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
            return "deadline", late, records
        time.sleep(POLL_S)


def stop(process: subprocess.Popen, finishing: bool) -> None:
    """SIGTERM to the launch (srun passes it on, SIGKILL after KillWait; torchrun too), unless it ends by itself."""
    if finishing:
        with contextlib.suppress(subprocess.TimeoutExpired):  # stopped below
            process.wait(timeout=STOP_GRACE_S)
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def launch(command: list[str], health: Path, world: int, timeout: float) -> tuple[str, list[int], Records]:
    """The launch's outcome (stopped: srun.sh got a stop signal), the ranks past a deadline and the last records."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.default_int_handler)  # each raises KeyboardInterrupt, as Ctrl-C does
    process = subprocess.Popen(command)
    outcome, late, records = "stopped", [], {}
    try:
        with contextlib.suppress(KeyboardInterrupt):  # outcome stays "stopped"
            outcome, late, records = supervise(process, health, world, timeout)
    finally:
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)  # the stop below must not be cut short
        stop(process, finishing=outcome == "finished")
    return outcome, late, records


def number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}" if value < 100 else f"{value:.0f}"


def table(nodes: list[Node]) -> list[str]:
    rows = [["node", "ranks", "GPUs", *(label for _, label, _ in FIGURES), "verdict"]]
    for node in nodes:
        figures = [number(node.figures.get(key)) for key, _, _ in FIGURES]
        rows.append([node.host, ranges(node.ranks), node.gpus, *figures, node.verdict.upper()])
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return ["  ".join(row[column].ljust(widths[column]) for column in range(len(row))).rstrip() for row in rows]


def job_figures(records: Records) -> dict[str, float | None]:
    return {op: link(records, list(records), f"job.{op}")[0] for op in ("all_reduce", "broadcast")}


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
        for evidence in node.evidence:  # the samples as measured: GB/s (TF/s, TB/s for a GPU's)
            samples = [f"{where} {' '.join(map(number, got or []))}" for where, got in evidence["samples"].items()]
            what = f"{evidence['figure']} {evidence.get('what', 'samples')}"
            lines.append(f"srun.sh: {node.host}:   {what}: {'; '.join(samples)}")
    if job:
        lines.append(f"srun.sh: the job: {job}")
    failed = [node.host for node in nodes if node.failed]
    if failed:
        hosts = ",".join(failed)
        verdict = f"failed on {len(failed)} of {len(nodes)} node(s): {hosts} (salloc/sbatch --exclude={hosts})"
    elif job:
        verdict = "failed"
    else:
        suspect = [node.host for node in nodes if node.verdict == "suspect"]
        but = f", {','.join(suspect)} suspect (not excluded: run the check again)" if suspect else ""
        verdict = f"passed on all {len(nodes)} node(s){but}"
    return [*lines, f"srun.sh: health check {verdict}; {run.run_dir / HEALTH_JSON}"]


def write_results(run: Run, nodes: list[Node], job: str) -> bool:
    """Writes RUN_DIR/health.json and health/failed-nodes, a line a rank; whether every node passed."""
    failed = [node.host for node in nodes if node.failed]
    result = {
        "passed": not failed and not job,
        "outcome": run.outcome,
        "seconds": round(run.seconds, 1),
        "timeout_s": run.timeout,
        "failed_nodes": failed,
        "suspect_nodes": [node.host for node in nodes if node.verdict == "suspect"],
        "job": {**job_figures(run.records), "finding": job or None},
        "nodes": [dataclasses.asdict(node) for node in nodes],
    }
    head = json.dumps(result, indent=1).removesuffix("\n}")
    records = sorted(run.records.items())
    ranks = ",\n".join(f'  "{rank}": {getattr(record, "text", "") or json.dumps(record)}' for rank, record in records)
    (run.run_dir / HEALTH_JSON).write_text(f'{head},\n "ranks": {{\n{ranks}\n }}\n}}\n')
    (run.run_dir / FAILED_NODES).write_text(",".join(failed) + ("\n" if failed else ""))
    return result["passed"]


def run(run_dir: Path, timeout_s: float, nodes: list[str], ranks_per_node: int, launch_command: list[str]) -> int:
    """The check: 0 if every node passed, else 1. Stop signals end it while it runs, not as it judges; then restored."""
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    health = run_dir / "health"
    remove_tree(health)  # an earlier check's records
    health.mkdir(parents=True)
    layout, timeout = Layout(nodes, ranks_per_node), float(timeout_s)
    started = time.monotonic()
    try:
        with many_records():
            outcome, late, known = launch(launch_command, health, layout.world, timeout)
            seconds = time.monotonic() - started
            result = Run(run_dir, layout, read_records(health, layout.world, known), outcome, late, timeout, seconds)
            verdicts, job = judge(result)
            print("\n".join(console(result, verdicts, job)), flush=True)  # stdout, as a launch's is the ranks' output
            return 0 if write_results(result, verdicts, job) else 1
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


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
    return run(args.run_dir, args.timeout, args.nodes.split(","), args.ranks_per_node, argv[argv.index("--") + 1 :])


if __name__ == "__main__":
    raise SystemExit(main())
