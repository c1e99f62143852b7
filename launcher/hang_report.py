"""srun.sh's hang report: before any rank is stopped, ask every rank for its Python stacks and torch's flight
recorder (SIGUSR2, answered by launcher/hang_dumps.py), then write RUN_DIR/hang-report.txt: which ranks are not in
the collective that the others wait in, on which host, and the top frames of every rank; a hang at start (ranks
that never joined torch.distributed) and a rank stuck in torch.distributed's teardown after an error are named as
such. The console gets three lines; the first names the ranks that did not answer, where any did not.

A stop (not --stalled) of a job that was progressing (its last step completed within twice the longest step so far,
on the ranks' own clocks) blames nothing: ranks are in collectives all the time. Nor is a collective that its ranks
entered less than the longest step so far before they were asked evidence of anything, stall or not. A stop before
a step time is known (start-up, the first steps) blames only what is older than the hang watch's limit then
(RUN_DIR/hang/watch.json; none while the watch is off): start-up takes as long as it takes.

    python3 launcher/hang_report.py RUN_DIR --why TEXT --world-size N --nodes HOST,... --ranks-per-node G
                                    (--step JOB.STEP | --local) [--stalled]

--step signals the job step with `scancel --signal=USR2` (every process of it: only the rank answers); --local
signals the pids that the ranks registered (each checked against its process start time). Runs on the launching host
with the standard library only (the flight recorder's records are plain pickles); torch's own analysis,
`torchfrtrace`, is added when this Python has torch and the records are NCCL's.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import itertools
import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

if not __package__:  # run as a script (launcher/hang.sh): the repository, not launcher/, holds the package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from launcher.hang_dumps import process_stat
from launcher.hang_watch import read_json
from launcher.health_report import exit_statuses

ANSWER_WAIT_S = 10.0  # the most a report waits for the ranks' answers
STACKS_GRACE_S = 3.0  # how long a rank whose stacks came may still take to dump its flight recorder
TOP_FRAMES = 6
FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
THREAD = re.compile(r"^(?:Current thread|Thread) 0x(?P<ident>[0-9a-f]+) \(most recent call first\):$")
RENDEZVOUS_FUNCTIONS = ("init_process_group", "rendezvous", "_store_based_barrier", "_create_c10d_store")
# Where a rank is once training has failed: Megatron Bridge aborts the process groups, which may never return.
TEARDOWN_FUNCTIONS = ("destroy_process_group", "_abort_process_group")
# A stop within this many of the longest steps so far after the last step is a stop of a progressing job: a step may
# take a little longer than every one before it (few steps seen yet, a logging or evaluation step).
STEP_SLACK = 2.0
# /proc/PID/stat's state letters (proc(5)), as the first line says them for a rank that did not answer.
PROCESS_STATES = {"R": "running", "S": "sleeping", "D": "in uninterruptible sleep", "T": "stopped"}
PROCESS_STATES |= {"t": "stopped by a tracer", "Z": "exited, not reaped", "X": "dead", "I": "idle"}


@dataclasses.dataclass
class Rank:
    rank: int
    host: str
    registered: dict | None = None  # rank-R.json: pid, start time, main thread
    answer: dict | None = None  # answer-rank-R.json: distributed, backend, last step
    frames: list[str] = dataclasses.field(default_factory=list)  # the main thread's, most recent first
    dump: dict | None = None  # the flight recorder record
    ended: str | None = None  # how it ended, if it had (its status record)

    def where(self) -> str:
        pid = f" (pid {self.registered['pid']})" if self.registered else ""
        return f"rank {self.rank} on {self.host}{pid}"

    def last_step(self) -> str:
        step = (self.answer or {}).get("last_step")
        return "" if step is None else f", last step {step}"

    def silent(self) -> bool:
        """Registered, still running as far as the records say, and neither its stacks nor its answer came."""
        return self.registered is not None and not self.ended and not self.answer and not self.frames


@dataclasses.dataclass
class Collective:
    """One process group's oldest collective that not every member completed."""

    group: str
    desc: str
    members: list[int]
    seq: int
    ops: dict[str, list[int]]  # what the waiting ranks are in: "gloo:all_reduce" -> ranks
    sizes: str
    behind: list[int]  # members with a record that have not entered it
    silent: list[int]  # members without a record
    unstarted: list[int]  # members in it whose GPU never started it, while another member's did (NCCL)
    gpu_states: str  # "started" (every GPU is in it), "scheduled" (no GPU started it), or "" (unknown)
    entered_s: float | None = None  # how long before its answer the first waiting rank entered it, where known

    def waiting(self) -> list[int]:
        return sorted(rank for ranks in self.ops.values() for rank in ranks)

    def outside(self) -> list[int]:
        """The members the others wait for."""
        return sorted(self.behind + self.silent + self.unstarted)

    def name(self) -> str:
        # no op when every member either completed it or never entered it (a broadcast's root is done early)
        op = max(self.ops, key=lambda op: len(self.ops[op]), default="a collective")
        label = f"{self.desc}, " if self.desc else ""
        return f"{op} #{self.seq} of process group {self.group} ({label}ranks {ranges(self.members)})"


def ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    runs = itertools.groupby(enumerate(sorted(set(ranks))), key=lambda item: item[1] - item[0])  # consecutive: alike
    bounds = [(run[0][1], run[-1][1]) for run in (list(group) for _, group in runs)]
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in bounds)


def thread_stacks(text: str) -> dict[int, list[str]]:
    """faulthandler's dump -> {thread ident: ["func (file:line)", ...]}, most recent call first."""
    stacks: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        header = THREAD.match(line)
        if header:
            current = stacks.setdefault(int(header.group("ident"), 16), [])
            current.clear()  # a later dump of the same thread replaces an earlier one
            continue
        frame = FRAME.match(line)
        if frame and current is not None:
            current.append(f"{frame.group('func')} ({frame.group('file')}:{frame.group('line')})")
    return stacks


def main_thread_frames(text: str, ident: int | None) -> list[str]:
    stacks = thread_stacks(text)
    if ident in stacks:
        return stacks[ident]
    return next(iter(stacks.values()), [])


def short(frame: str) -> str:
    """'func (/long/path/to/file.py:12)' -> 'func (file.py:12)'."""
    match = re.fullmatch(r"(.*) \((.*):(\d+)\)", frame)
    return f"{match.group(1)} ({Path(match.group(2)).name}:{match.group(3)})" if match else frame


def own_frame(frames: list[str]) -> str | None:
    """The first frame outside torch and the standard library's threading: where the rank's own code is."""
    for frame in frames:
        if "/torch/" not in frame and "threading.py" not in frame:
            return frame
    return None


def position(frames: list[str]) -> str:
    """Where a rank's main thread is, in a few words: 'all_reduce (distributed_c10d.py:2870) from step (x.py:9)'."""
    if not frames:
        return "no stacks"
    top, own = frames[0], own_frame(frames)
    if own is None or own == top:
        return short(top)
    return f"{short(top)} from {short(own)}"


# ---- Asking the ranks -------------------------------------------------------------------------------------------


def registered_ranks(hang: Path) -> dict[int, dict]:
    found = {}
    for path in hang.glob("rank-*.json"):
        record = read_json(path)
        if record is not None:
            found[int(record["rank"])] = record
    return found


def stacks_size(hang: Path, rank: int) -> int:
    try:
        return (hang / f"stacks-rank-{rank}.txt").stat().st_size
    except OSError:
        return 0


def forget_earlier_answers(hang: Path) -> None:
    for path in [*hang.glob("answer-rank-*.json"), *(hang / "fr").glob("rank-*")]:
        path.unlink(missing_ok=True)


def signal_step(step: str) -> str | None:
    result = subprocess.run(["scancel", "--signal=USR2", step], capture_output=True, text=True, check=False)
    return None if result.returncode == 0 else (result.stderr.strip() or f"scancel exited {result.returncode}")


def signal_local(registered: dict[int, dict]) -> str | None:
    """SIGUSR2 to each registered rank that is still the process it registered (pids are reused)."""
    for record in registered.values():
        if live_state(record) is None:
            continue
        try:
            os.kill(int(record["pid"]), signal.SIGUSR2)
        except ProcessLookupError:
            continue  # it ended in between
    return None


def live_state(record: dict) -> str | None:
    """The state letter of a registered rank's process while its pid is still that process (pids are reused)."""
    try:
        fields = process_stat(record["pid"])
    except OSError:
        return None
    return fields[0] if fields[19] == record.get("start_time") else None


def wait_for_answers(hang: Path, pending: set[int], before: dict[int, int]) -> None:
    """Until every pending rank answered, or its stacks came STACKS_GRACE_S ago, or ANSWER_WAIT_S passed."""
    started = time.monotonic()
    stacks_at: dict[int, float] = {}
    while pending and time.monotonic() - started < ANSWER_WAIT_S:
        now = time.monotonic()
        for rank in sorted(pending):
            if (hang / f"answer-rank-{rank}.json").exists():
                pending.discard(rank)
                continue
            if stacks_size(hang, rank) > before.get(rank, 0):
                stacks_at.setdefault(rank, now)
            if now - stacks_at.get(rank, now) > STACKS_GRACE_S:
                pending.discard(rank)
        time.sleep(0.5)


def read_stacks(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as stacks:
            stacks.seek(offset)
            return stacks.read().decode(errors="replace")
    except OSError:
        return ""


def read_dump(path: Path) -> dict | None:
    try:
        with path.open("rb") as record:
            return pickle.load(record)
    except (OSError, pickle.UnpicklingError, EOFError):
        return None


def gather(run_dir: Path, world: int, host_of: list[str], before: dict[int, int], ended: dict[int, str]) -> dict:
    hang = run_dir / "hang"
    registered = registered_ranks(hang)
    ranks = {}
    for number in range(world):
        record = registered.get(number)
        host = record["host"] if record else host_of[number] if number < len(host_of) else "?"
        rank = Rank(number, host, registered=record, ended=ended.get(number))
        rank.answer = read_json(hang / f"answer-rank-{number}.json")
        text = read_stacks(hang / f"stacks-rank-{number}.txt", before.get(number, 0))
        rank.frames = main_thread_frames(text, record["main_thread"] if record else None)
        if rank.answer and rank.answer.get("flight_recorder"):
            rank.dump = read_dump(hang / "fr" / rank.answer["flight_recorder"])
        ranks[number] = rank
    return ranks


# ---- What the records say ---------------------------------------------------------------------------------------


def group_records(dump: dict) -> dict[str, dict]:
    """One rank's flight recorder -> {process group name: desc, members, enqueued, completed, entries by seq}."""
    groups: dict[str, dict] = {}
    names: dict[str, tuple[str, str]] = {}

    def group(name: str, desc: str) -> dict:
        return groups.setdefault(name, {"desc": desc, "members": None, "enqueued": 0, "completed": 0, "entries": {}})

    for entry in dump.get("entries", []):
        if entry.get("is_p2p"):
            continue
        name, desc = (str(part) for part in entry["process_group"])
        desc = "" if desc == "undefined" else desc
        names[str(entry["pg_id"])] = (name, desc)
        group(name, desc)["entries"][int(entry["collective_seq_id"])] = entry
    for pg_id, status in dump.get("pg_status", {}).items():
        record = group(*names.get(str(pg_id), (str(pg_id), "")))
        record["enqueued"] = max(0, int(status["last_enqueued_collective"]))  # -1: none yet (sequence ids start at 1)
        record["completed"] = max(0, int(status["last_completed_collective"]))
    for name, config in dump.get("pg_config", {}).items():
        if name in groups:
            groups[name]["members"] = json.loads(config["ranks"])
    return groups


def collectives(ranks: dict[int, Rank], world: int) -> list[Collective]:
    """Every process group's oldest collective that not all of its members completed, the most telling first: those
    with members that are not in it, then those that the most ranks wait in."""
    records = {number: group_records(rank.dump) for number, rank in ranks.items() if rank.dump is not None}
    found = []
    for name in sorted({name for groups in records.values() for name in groups}):
        known = [groups[name] for groups in records.values() if name in groups]
        desc = next((group["desc"] for group in known if group["desc"]), "")
        members = next((group["members"] for group in known if group["members"]), None)
        if members is None:
            members = list(range(world)) if desc == "default_pg" else [n for n in records if name in records[n]]
        status = {}
        for member in members:
            if member in records:
                group = records[member].get(name, {"enqueued": 0, "completed": 0})
                status[member] = (group["enqueued"], group["completed"])
        if not any(enqueued > completed for enqueued, completed in status.values()):
            continue
        seq = min(completed for _, completed in status.values()) + 1
        ops: dict[str, list[int]] = {}
        states: dict[int, str] = {}
        entered: list[float] = []
        sizes = ""
        for member, (enqueued, completed) in sorted(status.items()):
            if enqueued >= seq > completed:
                entry = records[member][name]["entries"].get(seq) or {}
                ops.setdefault(entry.get("profiling_name", "a collective"), []).append(member)
                states[member] = str(entry.get("state"))
                sizes = sizes or str(entry.get("input_sizes", ""))
                entered += in_flight_s(ranks[member], entry)
        behind = sorted(member for member, (enqueued, _) in status.items() if enqueued < seq)
        silent = sorted(member for member in members if member not in records)
        started = [member for member, state in states.items() if state == "started"]
        unstarted = sorted(member for member, state in states.items() if state == "scheduled") if started else []
        found.append(
            Collective(
                name, desc, sorted(members), seq, ops, sizes, behind, silent, unstarted, gpu_states(known, states)
            )
        )
        found[-1].entered_s = max(entered, default=None)
    return sorted(found, key=lambda c: (not c.outside(), -len(c.waiting()), -len(c.members), c.seq))


def in_flight_s(rank: Rank, entry: dict) -> list[float]:
    """How long before its answer the rank had entered the collective (both on its own clock), if both are known."""
    asked, created = (rank.answer or {}).get("time"), entry.get("time_created_ns")
    return [asked - created / 1e9] if asked is not None and created is not None else []


def evidence(found: list[Collective], least_s: float | None) -> list[Collective]:
    """The collectives that say something: one its first rank entered less than `least_s` (the longest step so far;
    at a stop before a step time is known, the hang watch's limit) before it was asked is ordinary work, whatever the
    others do. None: every one."""
    if least_s is None:
        return found
    return [c for c in found if c.entered_s is None or c.entered_s >= least_s]


def gpu_states(groups: list[dict], states: dict[int, str]) -> str:
    """What NCCL's records say of the members' GPUs: all "started" the collective, none did ("scheduled", known
    only when TORCH_NCCL_ENABLE_TIMING records starts at all), or "" when that is unknown."""
    values = set(states.values())
    if values == {"started"}:
        return "started"
    timed = any(entry.get("time_discovered_started_ns") for group in groups for entry in group["entries"].values())
    return "scheduled" if values == {"scheduled"} and timed else ""


@dataclasses.dataclass
class Pace:
    """Where training was when the ranks were asked, from their answers (launcher/progress.py)."""

    step: int  # the last step a rank completed
    since_s: float  # from the latest step of any rank to its request, on that rank's clock
    longest_step_s: float  # the longest step any rank saw so far

    def progressing(self) -> bool:
        return self.since_s <= STEP_SLACK * self.longest_step_s

    def says(self) -> str:
        return f"last step {self.step}, {self.since_s:.2f} s before the stop"


def pace(ranks: dict[int, Rank], record: dict | None, asked: float) -> Pace | None:
    """None before the second step: until then no step's time is known. From the ranks' answers, else from rank 0's
    step record (RUN_DIR/hang/progress.json, as the hang watch reads it): a rank whose stacks came but whose answer
    did not (its flight-recorder dump still running) says nothing of its pace, and that is no sign of a stall."""
    answers = [r.answer for r in ranks.values() if r.answer and r.answer.get("longest_step_s") is not None]
    timed = [a for a in answers if a.get("last_step_time") is not None and a.get("time") is not None]
    if not timed and record and record.get("longest_step_s") is not None and record.get("time") is not None:
        return Pace(record["step"], max(0.0, asked - record["time"]), record["longest_step_s"])
    if not timed:
        return None
    since = min(max(0.0, a["time"] - a["last_step_time"]) for a in timed)
    longest = max(a["longest_step_s"] for a in timed)
    return Pace(max(a["last_step"] for a in timed), since, longest)


def process_state(record: dict) -> str:
    """What /proc says of a registered rank's process on this host."""
    state = live_state(record)
    if state is None:
        return "its process is gone"
    return f"{PROCESS_STATES[state]} ({state})" if state in PROCESS_STATES else f"in state {state}"


def seen_of(rank: Rank, ranks: dict[int, Rank], here: str) -> str:
    """What the launching host can see of a rank that did not answer: its process on this host; of another host,
    only that no answer came (and whether that host's other ranks answered, i.e. it is up)."""
    if rank.host == here and rank.registered is not None:
        return process_state(rank.registered)
    answered = [r.rank for r in ranks.values() if r.host == rank.host and not r.silent()]
    return f"no answer from node {rank.host}" + (f" ({ranks_phrase(answered)} on it answered)" if answered else "")


def silent_line(silent: list[Rank], ranks: dict[int, Rank], here: str, limit: int = 3) -> str:
    """'2 rank(s) did not answer: rank 5 on node2 (pid 42): stopped (T); ranks 8-15 on node3: no answer from ...'."""
    alike: dict[tuple[str, str], list[Rank]] = {}
    for rank in silent:
        alike.setdefault((rank.host, seen_of(rank, ranks, here)), []).append(rank)
    shown = [
        f"{group[0].where() if len(group) == 1 else f'{ranks_phrase(r.rank for r in group)} on {host}'}: {seen}"
        for (host, seen), group in list(alike.items())[:limit]
    ]
    more = f"; and {len(alike) - limit} more" if len(alike) > limit else ""
    return f"{len(silent)} rank(s) did not answer: " + "; ".join(shown) + more


def in_rendezvous(rank: Rank) -> bool:
    return any(name in frame for frame in rank.frames for name in RENDEZVOUS_FUNCTIONS)


def in_teardown(rank: Rank) -> bool:
    """Stuck taking torch.distributed down; it is no longer initialized there, but it had joined."""
    return any(name in frame for frame in rank.frames[:TOP_FRAMES] for name in TEARDOWN_FUNCTIONS)


def joined(rank: Rank) -> bool:
    answer = rank.answer or {}
    return bool(answer.get("distributed") or answer.get("last_step")) or in_teardown(rank)


def start_hang(ranks: dict[int, Rank]) -> tuple[list[Rank], list[Rank]] | None:
    """(waiting in the rendezvous, never joined) when some rank had not joined torch.distributed, else None."""
    waiting, never = [], []
    for rank in ranks.values():
        if joined(rank) or rank.ended:
            continue
        if in_rendezvous(rank):
            waiting.append(rank)
        elif rank.answer is not None or rank.registered is None:
            never.append(rank)
    return (waiting, never) if never or waiting else None


def whereabouts(rank: Rank, found: list[Collective]) -> str:
    """Where a rank that is not in a collective is instead."""
    if rank.ended:
        return rank.ended
    for collective in found:
        if rank.rank in collective.unstarted:
            return f"its GPU never started it (the work queued before it is stuck), at {position(rank.frames)}"
    for collective in found:
        for op, members in collective.ops.items():
            if rank.rank in members:
                return f"it waits in {op} #{collective.seq} of process group {collective.group}"
    if in_teardown(rank):
        return f"training ended with an error (its log has it) and it hangs in the teardown, at {position(rank.frames)}"
    if rank.frames:
        return f"at {position(rank.frames)}"
    if rank.registered is None:
        return "no answer: it had not started entrypoint.py's hang handler"
    return "no answer"


def last_steps(ranks: Iterable[Rank]) -> list[int]:
    """The distinct last steps the ranks answered with, in order."""
    return sorted({r.answer["last_step"] for r in ranks if r.answer and r.answer.get("last_step")})


def ranks_phrase(ranks: Iterable[int], verb: str = "") -> str:
    """'rank 3 waits', or 'ranks 0-2,5 wait' (with verb "wait")."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}" + (f" {verb}s" if verb else "")
    return f"ranks {ranges(ranks)}" + (f" {verb}" if verb else "")


def ranks_list(ranks: list[Rank], found: list[Collective], limit: int = 3) -> str:
    shown = [f"{rank.where()}: {whereabouts(rank, found)}" for rank in ranks[:limit]]
    more = f"; and {len(ranks) - limit} more" if len(ranks) > limit else ""
    return "; ".join(shown) + more


def summary(
    ranks: dict[int, Rank], found: list[Collective], why: str, report: Path, stop: Stop | None = None
) -> list[str]:
    """The three console lines. `stop`: an ordinary stop, which blames nothing."""
    head = f"srun.sh: hang report ({why}):"
    silent = [rank for rank in ranks.values() if rank.silent()]
    said = silent_line(silent, ranks, socket.gethostname()) if silent else ""
    if stop is not None:
        answered = sum(1 for r in ranks.values() if r.answer or r.frames)
        lines = [
            f"{head} {stop.says}",
            f"srun.sh:   {said}"
            if said
            else f"srun.sh:   an ordinary stop: {answered} of {len(ranks)} ranks answered; {stop.because}",
        ]
    else:
        lines = findings(ranks, found, head)
        if said:
            lines = [f"{head} {said}", f"srun.sh:   {lines[0].removeprefix(head).strip()}"]
    return [*lines, f"srun.sh:   every rank's top frames and torch's analysis: {report}"]


def findings(ranks: dict[int, Rank], found: list[Collective], head: str) -> list[str]:
    """What the records say, in two lines."""
    start = start_hang(ranks)
    if start and start[1]:
        waiting, never = start
        lines = [
            f"{head} hang at start: {len(never)} rank(s) never joined torch.distributed"
            + (f"; {ranks_phrase((r.rank for r in waiting), 'wait')} for them in the rendezvous" if waiting else ""),
            f"srun.sh:   never joined: {ranks_list(never, found)}",
        ]
    elif found and found[0].outside():
        first = found[0]
        outside = [ranks[n] for n in first.outside()]
        waiting = [n for n in first.waiting() if n not in first.unstarted]
        who = ranks_phrase(waiting, "wait") if waiting else "no rank waits"
        lines = [
            f"{head} {who} in {first.name()}; {len(outside)} rank(s) not in it",
            f"srun.sh:   not in it: {ranks_list(outside, found)}",
        ]
    elif found:
        first = found[0]
        hosts = ", ".join(sorted({ranks[n].host for n in first.members if n in ranks}))
        suspect = {
            "started": f"every GPU is in it: suspect the network between {hosts} (NCCL_DEBUG=INFO shows the transport)",
            "scheduled": "no member's GPU started it: the work queued before it is stuck on every member",
        }.get(first.gpu_states, f"suspect the network between {hosts}, or stuck GPUs (see the top frames)")
        lines = [f"{head} every member of {first.name()} is in it, and none completed it", f"srun.sh:   {suspect}"]
    elif tearing := [rank for rank in ranks.values() if in_teardown(rank)]:
        steps = last_steps(tearing)
        after = f" after step {steps[-1]}" if steps else ""
        lines = [
            f"{head} {ranks_phrase((r.rank for r in tearing), 'hang')} in torch.distributed's teardown{after}:"
            " its log has the error that ended training",
            f"srun.sh:   {tearing[0].where()}: at {position(tearing[0].frames)}",
        ]
    else:
        steps = last_steps(ranks.values())
        answered = sum(1 for r in ranks.values() if r.answer or r.frames)
        at = f", at step {steps[0]}" if len(steps) == 1 else f", at steps {steps[0]}-{steps[-1]}" if steps else ""
        first = next((r for r in ranks.values() if r.frames), None)
        lines = [
            f"{head} no rank waits in a collective that another rank is not in; {answered} of {len(ranks)} answered"
            + at,
            f"srun.sh:   {first.where()}: at {position(first.frames)}" if first else "srun.sh:   no stacks came",
        ]
    return lines


# ---- The report file --------------------------------------------------------------------------------------------


def frames_by_rank(ranks: dict[int, Rank]) -> list[str]:
    """Ranks with the same top frames (and end, if they had ended) together, so that a 4,096-rank job reads in a
    screen."""
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


def torch_analysis(ranks: dict[int, Rank], fr_dir: Path) -> list[str]:
    """torchfrtrace's own analysis of the records, where it runs: it reads NCCL's records (not gloo's) with torch."""
    dumps = [rank.dump for rank in ranks.values() if rank.dump is not None]
    names = {entry.get("profiling_name", "") for dump in dumps for entry in dump.get("entries", [])}
    command = f"torchfrtrace {fr_dir} -p rank- --allow-incomplete-ranks"
    if not dumps:
        return ["  no flight recorder records came"]
    if not any(name.startswith("nccl:") for name in names):
        return ["  torchfrtrace reads NCCL's records only; these are gloo's (the analysis above reads them)"]
    if importlib.util.find_spec("torch") is None:
        return [f"  {sys.executable} has no torch: run `{command}` where torch is"]
    module = "torch.distributed.flight_recorder.fr_trace"
    arguments = [sys.executable, "-m", module, str(fr_dir), "-p", "rank-", "--allow-incomplete-ranks"]
    try:
        result = subprocess.run(arguments, capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        return [f"  `{command}` took more than 120 s; run it yourself"]
    output = (result.stdout + result.stderr).splitlines()[-60:]
    return [f"  `{command}` (exit status {result.returncode}):", *(f"    {line}" for line in output)]


def report_text(
    ranks: dict[int, Rank],
    in_flight: list[Collective],
    why: str,
    run_dir: Path,
    *,
    seen: Pace | None,
    stop: Stop | None,
    found: list[Collective],
) -> str:
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
        *progress_lines(seen, stop),
        *silent_lines(ranks),
        "",
    ]
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


@dataclasses.dataclass
class Stop:
    """A stop that blames nothing: what it says, and what backs that."""

    says: str
    because: str


def judge(
    ranks: dict[int, Rank], in_flight: list[Collective], seen: Pace | None, watch: dict | None, stalled: bool
) -> tuple[Stop | None, list[Collective]]:
    """(the ordinary stop, or None; the collectives that are evidence). `watch`: RUN_DIR/hang/watch.json, with
    "since_s" (from the launch to the request) added."""
    if not stalled and seen is not None and seen.progressing():
        return Stop(
            f"training was progressing: {seen.says()}", f"the longest step so far took {seen.longest_step_s:.2f} s"
        ), []
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
    steps = last_steps(ranks.values())
    after = f", {watch['since_s']:.0f} s after the launch" if watch else ""
    done = (
        f"stopped before the second step: step {steps[-1]} had completed"
        if steps
        else "stopped during start-up: no training step had completed"
    )
    return f"{done}{after}; nothing is blamed (a stop is not a stall)"


def read_watch(hang: Path, asked: float) -> dict | None:
    watch = read_json(hang / "watch.json")
    return None if watch is None else {**watch, "since_s": asked - watch["launched"]}


def progress_lines(seen: Pace | None, stop: Stop | None) -> list[str]:
    if stop is not None:
        return [f"Progress: {stop.says}; {stop.because}; the collectives below are ordinary work"]
    if seen is not None:
        return [
            f"Progress: last step {seen.step}, {seen.since_s:.1f} s before the ranks were asked; the longest step so"
            f" far took {seen.longest_step_s:.2f} s"
        ]
    return []


def silent_lines(ranks: dict[int, Rank]) -> list[str]:
    silent = [rank for rank in ranks.values() if rank.silent()]
    if not silent:
        return []
    here = socket.gethostname()
    return [f"Did not answer (seen from {here}):", *(f"  {r.where()}: {seen_of(r, ranks, here)}" for r in silent)]


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
    start = start_hang(ranks)
    if start:
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


def collect(args: argparse.Namespace) -> int:
    run_dir: Path = args.run_dir
    hang = run_dir / "hang"
    hang.mkdir(parents=True, exist_ok=True)
    registered = registered_ranks(hang)
    ended = {
        rank: f"it had ended, with exit status {status}"
        for rank, status in exit_statuses(run_dir, args.world_size).items()
    }
    before = {rank: stacks_size(hang, rank) for rank in range(args.world_size)}
    forget_earlier_answers(hang)
    asked = time.time()
    failed = signal_step(args.step) if args.step else signal_local(registered)
    if failed:
        print(f"srun.sh: hang report: could not signal the ranks: {failed}", file=sys.stderr)
    wait_for_answers(hang, set(registered) - set(ended), before)
    host_of = [host for host in args.nodes.split(",") for _ in range(args.ranks_per_node)]
    ranks = gather(run_dir, args.world_size, host_of, before, ended)
    in_flight = collectives(ranks, args.world_size)
    seen = pace(ranks, read_json(hang / "progress.json"), asked)
    stop, found = judge(ranks, in_flight, seen, read_watch(hang, asked), args.stalled)
    path = run_dir / "hang-report.txt"
    path.write_text(report_text(ranks, in_flight, args.why, run_dir, seen=seen, stop=stop, found=found))
    for line in summary(ranks, found, args.why, path, stop):
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
    return collect(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
