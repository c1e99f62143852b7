"""srun.sh's hang report: before any rank is stopped, ask every rank for its Python stacks and torch's flight
recorder (SIGUSR2), then write RUN_DIR/hang-report.txt and say three lines on the console (docs/health.md).

    python3 launcher/hang/report.py RUN_DIR --why TEXT --world-size N --nodes HOST,... --ranks-per-node G
                                    (--step JOB.STEP | --local) [--stalled]

--step signals the job step with `scancel --signal=USR2`; --local signals the pids that the ranks registered.
"""

import argparse
import dataclasses
import socket
import sys
import time
from collections.abc import Iterable
from pathlib import Path

if not __package__:  # run as a script (launcher/host/supervisor.py): the repository, two folders up, holds it
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from launcher.hang import answers
from launcher.hang.answers import Rank, position, short
from launcher.hang.collectives import Collective, collectives, evidence, ranges, torch_analysis
from launcher.hang.progress import PROGRESS_FILE, read_json
from launcher.health.judge import exit_statuses
from launcher.run_files import many_records

TOP_FRAMES = 6
RENDEZVOUS_FUNCTIONS = ("init_process_group", "rendezvous", "_store_based_barrier", "_create_c10d_store")
# Where a rank is once training has failed: Megatron Bridge aborts the process groups, which may never return.
TEARDOWN_FUNCTIONS = ("destroy_process_group", "_abort_process_group")
# A stop within this many of the longest steps after the last step is a stop of a progressing job.
STEP_SLACK = 2.0


@dataclasses.dataclass
class Pace:
    """Where training was when the ranks were asked, from their answers (launcher/hang/progress.py)."""

    step: int  # the last step a rank completed
    since_s: float  # from the latest step of any rank to its request, on that rank's clock
    longest_step_s: float  # the longest step any rank saw so far


@dataclasses.dataclass
class Stop:
    """A stop that blames nothing: what it says, and what backs that."""

    says: str
    because: str


def pace(ranks: dict[int, Rank], record: dict | None, asked: float) -> Pace | None:
    """None before the second step; from the ranks' answers, else rank 0's step record."""
    keys = ("longest_step_s", "last_step_time", "time")
    timed = [r.answer for r in ranks.values() if r.answer and all(r.answer.get(key) is not None for key in keys)]
    if timed:
        since = min(max(0.0, a["time"] - a["last_step_time"]) for a in timed)
        return Pace(max(a["last_step"] for a in timed), since, max(a["longest_step_s"] for a in timed))
    if record and record.get("longest_step_s") is not None and record.get("time") is not None:
        return Pace(record["step"], max(0.0, asked - record["time"]), record["longest_step_s"])
    return None


def read_watch(hang: Path, asked: float) -> dict | None:
    """RUN_DIR/hang/watch.json, with "since_s" (from the launch to the request) added; None while the watch is off."""
    watch = read_json(hang / "watch.json")
    return None if watch is None else {**watch, "since_s": asked - watch["launched"]}


def judge(
    ranks: dict[int, Rank], in_flight: list[Collective], seen: Pace | None, watch: dict | None, stalled: bool
) -> tuple[Stop | None, list[Collective]]:
    """(the ordinary stop, or None; the collectives that are evidence). `watch`: read_watch()'s."""
    if not stalled and seen is not None and seen.since_s <= STEP_SLACK * seen.longest_step_s:
        says = f"training was progressing: last step {seen.step}, {seen.since_s:.2f} s before the stop"
        return Stop(says, f"the longest step so far took {seen.longest_step_s:.2f} s"), []
    if stalled or seen is not None:
        return None, evidence(in_flight, seen.longest_step_s if seen else None)
    limit = (watch or {}).get("limit_s")
    if limit is None:
        return Stop(start_up(ranks, watch), "the hang watch is off, so nothing counts as a stall"), []
    old = [c for c in evidence(in_flight, limit) if c.entered_s is not None]
    if old or (start_hang(ranks) and watch["since_s"] > limit):
        return None, old
    return Stop(start_up(ranks, watch), f"the hang watch would call it a stall after {limit:g} s"), []


def start_up(ranks: dict[int, Rank], watch: dict | None) -> str:
    """What a stop before a step time is known says: how far the launch had come."""
    if steps := last_steps(ranks.values()):
        done = f"stopped before the second step: step {steps[-1]} had completed"
    else:
        done = "stopped during start-up: no training step had completed"
    after = f", {watch['since_s']:.0f} s after the launch" if watch else ""
    return f"{done}{after}; nothing is blamed (a stop is not a stall)"


def last_steps(ranks: Iterable[Rank]) -> list[int]:
    """The distinct last steps the ranks answered with, in order."""
    return sorted({r.answer["last_step"] for r in ranks if r.answer and r.answer.get("last_step")})


def in_teardown(rank: Rank) -> bool:
    """Stuck taking torch.distributed down; it is no longer initialized there, but it had joined."""
    return any(name in frame for frame in rank.frames[:TOP_FRAMES] for name in TEARDOWN_FUNCTIONS)


def start_hang(ranks: dict[int, Rank]) -> tuple[list[Rank], list[Rank]] | None:
    """(waiting in the rendezvous, never joined) when some rank had not joined torch.distributed, else None."""
    waiting, never = [], []
    for rank in ranks.values():
        answer = rank.answer or {}
        if answer.get("distributed") or answer.get("last_step") or in_teardown(rank) or rank.ended:
            continue
        if any(name in frame for frame in rank.frames for name in RENDEZVOUS_FUNCTIONS):
            waiting.append(rank)
        elif rank.answer is not None or rank.registered is None:
            never.append(rank)
    return (waiting, never) if never or waiting else None


def summary(
    ranks: dict[int, Rank], found: list[Collective], why: str, report: Path, stop: Stop | None = None
) -> list[str]:
    """The three console lines. `stop`: an ordinary stop, which blames nothing."""
    head = f"srun.sh: hang report ({why}):"
    silent = [rank for rank in ranks.values() if rank.silent()]
    said = silent_line(silent, ranks, socket.gethostname()) if silent else ""
    if stop is not None:
        answered = sum(1 for r in ranks.values() if r.answer or r.frames)
        ordinary = f"an ordinary stop: {answered} of {len(ranks)} ranks answered; {stop.because}"
        lines = [f"{head} {stop.says}", f"srun.sh:   {said or ordinary}"]
    else:
        lines = findings(ranks, found, head)
        if said:
            lines = [f"{head} {said}", f"srun.sh:   {lines[0].removeprefix(head).strip()}"]
    return [*lines, f"srun.sh:   every rank's top frames and torch's analysis: {report}"]


def findings(ranks: dict[int, Rank], found: list[Collective], head: str) -> list[str]:
    first, second = hang_at_start(ranks, found) or in_collective(ranks, found) or elsewhere(ranks)
    return [f"{head} {first}", f"srun.sh:   {second}"]


def hang_at_start(ranks: dict[int, Rank], found: list[Collective]) -> tuple[str, str] | None:
    waiting, never = start_hang(ranks) or ([], [])
    if not never:
        return None
    them = f"; {ranks_phrase((r.rank for r in waiting), 'wait')} for them in the rendezvous" if waiting else ""
    return (
        f"hang at start: {len(never)} rank(s) never joined torch.distributed{them}",
        f"never joined: {ranks_list(never, found)}",
    )


def in_collective(ranks: dict[int, Rank], found: list[Collective]) -> tuple[str, str] | None:
    """The most telling collective: the ranks not in it, or what keeps every member in it."""
    if not found:
        return None
    first = found[0]
    if first.outside():
        outside = [ranks[n] for n in first.outside()]
        waiting = [n for n in first.waiting() if n not in first.unstarted]
        who = ranks_phrase(waiting, "wait") if waiting else "no rank waits"
        return f"{who} in {first.name()}; {len(outside)} rank(s) not in it", f"not in it: {ranks_list(outside, found)}"
    hosts = ", ".join(sorted({ranks[n].host for n in first.members if n in ranks}))
    suspect = {
        "started": f"every GPU is in it: suspect the network between {hosts} (NCCL_DEBUG=INFO shows the transport)",
        "scheduled": "no member's GPU started it: the work queued before it is stuck on every member",
    }.get(first.gpu_states, f"suspect the network between {hosts}, or stuck GPUs (see the top frames)")
    return f"every member of {first.name()} is in it, and none completed it", suspect


def elsewhere(ranks: dict[int, Rank]) -> tuple[str, str]:
    """No collective tells: ranks stuck in the teardown after an error, or where the first rank with stacks is."""
    if tearing := [rank for rank in ranks.values() if in_teardown(rank)]:
        steps = last_steps(tearing)
        after = f" after step {steps[-1]}" if steps else ""
        return (
            f"{ranks_phrase((r.rank for r in tearing), 'hang')} in torch.distributed's teardown{after}:"
            " its log has the error that ended training",
            f"{tearing[0].where()}: at {position(tearing[0].frames)}",
        )
    steps = last_steps(ranks.values())
    answered = sum(1 for r in ranks.values() if r.answer or r.frames)
    at = f", at step {steps[0]}" if len(steps) == 1 else f", at steps {steps[0]}-{steps[-1]}" if steps else ""
    first = next((r for r in ranks.values() if r.frames), None)
    return (
        f"no rank waits in a collective that another rank is not in; {answered} of {len(ranks)} answered{at}",
        f"{first.where()}: at {position(first.frames)}" if first else "no stacks came",
    )


def answered_by_host(ranks: dict[int, Rank]) -> dict[str, list[int]]:
    answered: dict[str, list[int]] = {}
    for rank in ranks.values():
        if not rank.silent():
            answered.setdefault(rank.host, []).append(rank.rank)
    return answered


def seen_of(rank: Rank, answered: dict[str, list[int]], here: str) -> str:
    """What the launching host can see of a rank that did not answer (docs/health.md)."""
    if rank.host == here and rank.registered is not None:
        return answers.process_state(rank.registered)
    others = answered.get(rank.host, [])
    return f"no answer from node {rank.host}" + (f" ({ranks_phrase(others)} on it answered)" if others else "")


def silent_line(silent: list[Rank], ranks: dict[int, Rank], here: str, limit: int = 3) -> str:
    """'2 rank(s) did not answer: rank 5 on node2 (pid 42): stopped (T); ranks 8-15 on node3: no answer from ...'."""
    answered = answered_by_host(ranks)
    alike: dict[tuple[str, str], list[Rank]] = {}
    for rank in silent:
        alike.setdefault((rank.host, seen_of(rank, answered, here)), []).append(rank)
    shown = [
        f"{group[0].where() if len(group) == 1 else f'{ranks_phrase(r.rank for r in group)} on {host}'}: {seen}"
        for (host, seen), group in list(alike.items())[:limit]
    ]
    more = f"; and {len(alike) - limit} more" if len(alike) > limit else ""
    return f"{len(silent)} rank(s) did not answer: " + "; ".join(shown) + more


def whereabouts(rank: Rank, found: list[Collective]) -> str:
    """Where a rank that is not in a collective is instead."""
    if rank.ended:
        return rank.ended
    if any(rank.rank in collective.unstarted for collective in found):
        return f"its GPU never started it (the work queued before it is stuck), at {position(rank.frames)}"
    for collective in found:
        for op, members in collective.ops.items():
            if rank.rank in members:
                return f"it waits in {op} #{collective.seq} of process group {collective.group}"
    if in_teardown(rank):
        return f"training ended with an error (its log has it) and it hangs in the teardown, at {position(rank.frames)}"
    if rank.frames:
        return f"at {position(rank.frames)}"
    return "no answer" + (": it had not started entrypoint.py's hang handler" if rank.registered is None else "")


def ranks_phrase(ranks: Iterable[int], verb: str = "") -> str:
    """'rank 3 waits', or 'ranks 0-2,5 wait' (with verb "wait")."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}" + (f" {verb}s" if verb else "")
    return f"ranks {ranges(ranks)}" + (f" {verb}" if verb else "")


def ranks_list(ranks: list[Rank], found: list[Collective], limit: int = 3) -> str:
    shown = [f"{rank.where()}: {whereabouts(rank, found)}" for rank in ranks[:limit]]
    return "; ".join(shown) + (f"; and {len(ranks) - limit} more" if len(ranks) > limit else "")


def report_text(
    ranks: dict[int, Rank], in_flight: list[Collective], why: str, run_dir: Path, *, seen: Pace | None,
    stop: Stop | None, found: list[Collective]
) -> str:  # fmt: skip
    answered = sum(1 for rank in ranks.values() if rank.answer)
    stacks = sum(1 for rank in ranks.values() if rank.frames)
    records = sum(1 for rank in ranks.values() if rank.dump is not None)
    hosts = {rank.host for rank in ranks.values()}
    now = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    lines = [
        f"Hang report of run {run_dir.name}, {now}",
        f"Why: {why}",
        f"Ranks: {len(ranks)} on {len(hosts)} host(s); stacks from {stacks}, answers from {answered},"
        f" flight recorder records from {records}",
    ]
    if stop is not None:
        lines.append(f"Progress: {stop.says}; {stop.because}; the collectives below are ordinary work")
    elif seen is not None:
        lines.append(f"Progress: last step {seen.step}, {seen.since_s:.1f} s before the ranks were asked; the longest"
                     f" step so far took {seen.longest_step_s:.2f} s")  # fmt: skip
    if silent := [rank for rank in ranks.values() if rank.silent()]:
        here, by_host = socket.gethostname(), answered_by_host(ranks)
        lines.append(f"Did not answer (seen from {here}):")
        lines += [f"  {rank.where()}: {seen_of(rank, by_host, here)}" for rank in silent]
    lines.append("")
    if stop:
        lines += [
            "Collectives in flight when the ranks were asked (torch's flight recorder, oldest first per group):",
            *collective_lines(in_flight),
        ]
    else:
        lines += findings_lines(ranks, found, len(in_flight) - len(found))
    lines += ["", f"Main threads, top {TOP_FRAMES} frames (most recent first):", *frames_by_rank(ranks), ""]
    analysis = ["  not run: an ordinary stop"] if stop else torch_analysis(ranks, run_dir / "hang" / "fr")
    lines += ["torch's analysis:", *analysis, ""]
    lines.append(
        f"Records: {run_dir / 'hang'}/: stacks-rank-R.txt (every thread of rank R), fr/rank-R (flight recorder),"
        " answer-rank-R.json"
    )
    return "\n".join(lines) + "\n"


def collective_lines(collectives: list[Collective], ranks: dict[int, Rank] | None = None) -> list[str]:
    """Each collective, what its ranks are in, and (with `ranks`: as evidence) where its members outside it are."""
    lines = []
    for collective in collectives:
        entered = "" if collective.entered_s is None else f", entered {collective.entered_s:.1f} s before the request"
        lines.append(f"  {collective.name()}, sizes {collective.sizes or '?'}{entered}")
        for op, members in sorted(collective.ops.items(), key=lambda item: -len(item[1])):
            lines.append(f"    in {op}: ranks {ranges(members)}")
        for rank in (ranks[n] for n in collective.outside()) if ranks is not None else ():
            lines.append(f"    not in it: {rank.where()}{rank.last_step()}: {whereabouts(rank, collectives)}")
    return lines or ["  none"]


def findings_lines(ranks: dict[int, Rank], found: list[Collective], recent: int) -> list[str]:
    """The start, and the collectives that are evidence; `recent`: how many others were left out."""
    lines: list[str] = []
    if start := start_hang(ranks):
        waiting, never = start
        lines.append("Start: not every rank joined torch.distributed (its rendezvous, init_process_group)")
        if waiting:
            lines.append(f"  waiting in the rendezvous: ranks {ranges(r.rank for r in waiting)}")
        lines += [f"  never joined: {rank.where()}: {whereabouts(rank, found)}" for rank in never]
        lines.append("")
    lines.append("Collectives not completed by every member (torch's flight recorder, oldest first per group):")
    lines += collective_lines(found, ranks)
    if recent:
        lines.append(f"  and {recent} entered too recently before the ranks were asked to tell anything")
    return lines


def frames_by_rank(ranks: dict[int, Rank]) -> list[str]:
    """Ranks with the same top frames (and end) together, so that a 4,096-rank job reads in a screen."""
    alike: dict[tuple[str, tuple[str, ...]], list[Rank]] = {}
    for rank in ranks.values():
        alike.setdefault((rank.ended or "", tuple(short(f) for f in rank.frames[:TOP_FRAMES])), []).append(rank)
    lines = []
    for (_, frames), group in sorted(alike.items(), key=lambda item: (len(item[1]), item[1][0].rank)):
        hosts = sorted({rank.host for rank in group})
        where = (
            group[0].where() + group[0].last_step()
            if len(group) == 1
            else (f"ranks {ranges(r.rank for r in group)} on {', '.join(hosts[:4])}{' ...' if len(hosts) > 4 else ''}")
        )
        state = group[0].ended or ("" if frames else "no stacks")
        lines.append(f"  {where}{': ' + state if state else ''}")
        lines += [f"      {frame}" for frame in frames]
    return lines


def collect(
    run_dir: Path, why: str, *, world_size: int, nodes: str, ranks_per_node: int, step: str | None, stalled: bool
) -> int:
    """Ask every rank, write RUN_DIR/hang-report.txt, say three lines on stderr; 0. The arguments are main()'s."""
    hang = run_dir / "hang"
    hang.mkdir(parents=True, exist_ok=True)
    statuses = exit_statuses(run_dir, world_size)
    ended = {rank: f"it had ended, with exit status {status}" for rank, status in statuses.items()}
    before = {rank: answers.stacks_size(hang, rank) for rank in range(world_size)}
    asked = answers.ask(hang, step, set(ended), before)
    host_of = [host for host in nodes.split(",") for _ in range(ranks_per_node)]
    with many_records():
        ranks = answers.gather(run_dir, world_size, host_of, before, ended)
        in_flight = collectives(ranks, world_size)
        seen = pace(ranks, read_json(hang / PROGRESS_FILE), asked)
        stop, found = judge(ranks, in_flight, seen, read_watch(hang, asked), stalled)
        path = run_dir / "hang-report.txt"
        path.write_text(report_text(ranks, in_flight, why, run_dir, seen=seen, stop=stop, found=found))
        for line in summary(ranks, found, why, path, stop):
            print(line, file=sys.stderr)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--why", required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--nodes", required=True, help="the job's hosts, in rank order, comma-separated")
    parser.add_argument("--ranks-per-node", type=int, required=True)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--step", help="JOB.STEP of the ranks (scancel --signal=USR2)")
    target.add_argument("--local", action="store_true", help="signal the registered pids")
    parser.add_argument("--stalled", action="store_true", help="the hang watch, not a stop, asks")
    args = vars(parser.parse_args())
    args.pop("local")  # the same as no --step
    return collect(**args)


if __name__ == "__main__":
    raise SystemExit(main())
