"""srun.sh's health check, on the launching host: run the check's launch (every rank runs launcher/health.py), stop
it when a rank is stuck in a part past its deadline, and turn the ranks' records into one table on the console and
RUN_DIR/health.json: node, ranks, each figure, a verdict (judge.py), and every outlier named with what to do.

    python3 launcher/health/report.py RUN_DIR --timeout S --nodes HOST,... --ranks-per-node G -- LAUNCH...

The table goes to stdout. Exit status 0 when every node passes, 1 otherwise; RUN_DIR/health/failed-nodes then lists
the nodes to exclude (a batch job with SRUNSH_HEALTH=1 excludes them before it requeues itself). run() is the same,
for a caller that imports it. Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

if not __package__:  # run as a script: the repository, two folders up, holds the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from launcher.health.judge import judge
from launcher.health.records import Layout, Run, deadline, read_records
from launcher.health.table import console, write_results
from launcher.run_files import many_records, remove_tree

POLL_S = 0.5
STOP_GRACE_S = 60.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopRequestedError(Exception):
    """srun.sh was stopped (SIGINT/SIGTERM) while the check ran."""


def on_stop(signum: int, _frame: object) -> None:
    raise StopRequestedError(signal.Signals(signum).name)


Records = dict[int, dict]


def supervise(process: subprocess.Popen, health: Path, world: int, timeout: float) -> tuple[str, list[int], Records]:
    """Until every rank finished ("finished"), the launch ended first ("exited"), or ranks overstayed a part's
    deadline ("deadline", those ranks); and the records read last. A part's clock starts when this host first sees a
    rank in it (the start's at the launch), so the clocks of other hosts never matter."""
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
    """SIGTERM to the launch (srun passes it to every rank, then SIGKILL after KillWait; torchrun likewise), unless
    its ranks have finished and it ends by itself."""
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
    """Runs the launch to its outcome (stopped: srun.sh got a stop signal); the ranks past a deadline, and the records
    read last (the finished ones need no second read)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, on_stop)
    process = subprocess.Popen(command)
    outcome, late, records = "stopped", [], {}
    try:
        outcome, late, records = supervise(process, health, world, timeout)
    except StopRequestedError:
        pass  # outcome stays "stopped"
    finally:
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)  # the stop below must not be cut short
        stop(process, finishing=outcome == "finished")
    return outcome, late, records


def run(run_dir: Path, timeout_s: float, nodes: list[str], ranks_per_node: int, launch_command: list[str]) -> int:
    """The check: 0 when every node passed, 1 otherwise. SIGINT, SIGTERM and SIGHUP stop it while it runs, and are
    ignored while it stops the launch and judges; the caller's handlers are back when it returns."""
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
