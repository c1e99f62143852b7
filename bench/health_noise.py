"""How often srun.sh's health check condemns a healthy node, and whether it names a node whose link is capped: on the
tests' SLURM of network namespaces (tests/slurm_cluster.py, three nodes, one rank a node, gloo over veth on this
machine's CPUs), `salloc -N 3 srun.sh --health --no-container` again and again, each arm in its own rounds:

    healthy      no cap: every node that the check condemns is a false positive
    500mbit      node3's link capped with tc's token-bucket filter (tbf) at 500 Mbit/s both ways
    2500mbit     the same at 2.5 Gbit/s

    python3 bench/health_noise.py [--healthy 20] [--capped 5] [--markdown FILE]

Needs root, Debian's slurm-wlm and munge, iproute2's tc, and the test venv (the check's ranks run this interpreter's
torch). Prints one table: runs, how many named the capped node (condemned), how many condemned a healthy node, how
many left a node suspect (named, not excluded), and the figures of the capped node and of the others.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.slurm_cluster import THREE_NODES, SlurmCluster, capped_link, running_cluster
from tests.srun_world import _world

CAPPED = "node3"
ALLOCATION = ("--nodes=3", "--gpus-per-node=4")  # srun.sh asks each rank to see a GPU; the test nodes count 4
ARMS = {"healthy": None, "500mbit": 500, "2500mbit": 2500}


KEEP: list[Path] = []  # --keep DIR: each run's health.json is copied there


def one_check(cluster: SlurmCluster, name: str) -> dict:
    """One `salloc -N 3 srun.sh --health --no-container`; its health.json, with the console and how long it took."""
    with tempfile.TemporaryDirectory(prefix="health-noise-") as directory:
        world = _world(Path(directory), cluster.env, cluster)
        started = time.monotonic()
        result, _ = world.in_allocation(
            "--no-container", "--health", salloc=ALLOCATION, env={"SRUNSH_GPUS_PER_NODE": "1"}, timeout=300
        )
        seconds = time.monotonic() - started
        reports = list((world.dir / "outputs" / "health").glob("*/health.json"))
        report = json.loads(reports[0].read_text()) if reports else {"nodes": [], "failed_nodes": []}
        if KEEP and reports:
            shutil.copy(reports[0], KEEP[0] / f"{name}.json")
        cluster.wait_idle()
    return {**report, "console": result.stdout + result.stderr, "wall_s": seconds, "status": result.returncode}


def verdicts(report: dict) -> dict[str, str]:
    return {node["host"]: node["verdict"] for node in report["nodes"]}


def figure(report: dict, host: str, key: str) -> float | None:
    return next((node["figures"].get(key) for node in report["nodes"] if node["host"] == host), None)


def summary(arm: str, reports: list[dict]) -> dict:
    capped = CAPPED if ARMS[arm] else None
    condemned = [[h for h in r["failed_nodes"]] for r in reports]
    suspect = [[h for h, v in verdicts(r).items() if v == "suspect"] for r in reports]
    others = [h for h in THREE_NODES if h != capped]
    return {
        "arm": arm,
        "runs": len(reports),
        "capped named": sum(capped in hosts for hosts in condemned) if capped else "-",
        "healthy condemned": sum(any(h in others for h in hosts) for hosts in condemned),
        "suspect": sum(bool(hosts) for hosts in suspect),
        "unfinished": sum(r.get("outcome") != "finished" for r in reports),
        f"{CAPPED} pair BC": median_of(reports, [CAPPED], "pair.broadcast"),
        "others pair BC": median_of(reports, [h for h in THREE_NODES if h != CAPPED], "pair.broadcast"),
        f"{CAPPED} pair AR": median_of(reports, [CAPPED], "pair.all_reduce"),
        "others pair AR": median_of(reports, [h for h in THREE_NODES if h != CAPPED], "pair.all_reduce"),
        "check s": f"{statistics.median(r['wall_s'] for r in reports):.1f}",
    }


def median_of(reports: list[dict], hosts: list[str], key: str) -> str:
    values = [v for r in reports for h in hosts if (v := figure(r, h, key)) is not None]
    return f"{statistics.median(values):.3g}" if values else "n/a"


def markdown(rows: list[dict]) -> list[str]:
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(row[key]) for key in header) + " |" for row in rows]


def flagged_lines(report: dict) -> list[str]:
    return [line for line in report["console"].splitlines() if line.startswith("srun.sh: node")]


def run_arm(cluster: SlurmCluster, arm: str, runs: int) -> list[dict]:
    reports = []
    with capped_link(cluster, CAPPED, ARMS[arm]) if ARMS[arm] else contextlib.nullcontext():
        for run in range(runs):
            report = one_check(cluster, f"{arm}-{run + 1}")
            reports.append(report)
            flagged = "; ".join(flagged_lines(report)) or "-"
            print(f"# {arm} {run + 1}/{runs}: {verdicts(report)} in {report['wall_s']:.1f} s: {flagged}", flush=True)
    return reports


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--healthy", type=int, default=20, help="runs of the uncapped cluster")
    parser.add_argument("--capped", type=int, default=5, help="runs with each cap")
    parser.add_argument("--markdown", type=Path, help="also write the table and every flagged line here")
    parser.add_argument("--keep", type=Path, help="a directory for each run's health.json")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        KEEP.append(args.keep)
    rows, details = [], []
    with running_cluster(node_addr=True, nodes=THREE_NODES) as cluster:
        for arm in ARMS:
            runs = args.healthy if arm == "healthy" else args.capped
            if not runs:
                continue
            reports = run_arm(cluster, arm, runs)
            rows.append(summary(arm, reports))
            details += [f"- {arm} {n + 1}: " + ("; ".join(flagged_lines(r)) or "all ok") for n, r in enumerate(reports)]
    table = markdown(rows)
    print("\n".join(table))
    if args.markdown:
        args.markdown.write_text("\n".join([*table, "", *details]) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
