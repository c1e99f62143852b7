"""What a hang report may blame. A stop (not a stall) of a job that was progressing blames nothing, nor does a
collective entered less than the longest step so far before the ranks were asked; a stop before a step time is known
blames only what is older than the hang watch's limit then. A hang at start is ranks that never joined
torch.distributed."""

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from launcher.hang.answers import TOP_FRAMES, Rank
from launcher.hang.collectives import Collective, evidence
from launcher.hang.progress import read_json

RENDEZVOUS_FUNCTIONS = ("init_process_group", "rendezvous", "_store_based_barrier", "_create_c10d_store")
# Where a rank is once training has failed: Megatron Bridge aborts the process groups, which may never return.
TEARDOWN_FUNCTIONS = ("destroy_process_group", "_abort_process_group")
# A stop within this many of the longest steps so far after the last step is a stop of a progressing job: a step may
# take a little longer than every one before it (few steps seen yet, a logging or evaluation step).
STEP_SLACK = 2.0


@dataclasses.dataclass
class Pace:
    """Where training was when the ranks were asked, from their answers (launcher/hang/progress.py)."""

    step: int  # the last step a rank completed
    since_s: float  # from the latest step of any rank to its request, on that rank's clock
    longest_step_s: float  # the longest step any rank saw so far

    def progressing(self) -> bool:
        return self.since_s <= STEP_SLACK * self.longest_step_s

    def says(self) -> str:
        return f"last step {self.step}, {self.since_s:.2f} s before the stop"


@dataclasses.dataclass
class Stop:
    """A stop that blames nothing: what it says, and what backs that."""

    says: str
    because: str


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


def read_watch(hang: Path, asked: float) -> dict | None:
    """RUN_DIR/hang/watch.json, with "since_s" (from the launch to the request) added; None while the watch is off."""
    watch = read_json(hang / "watch.json")
    return None if watch is None else {**watch, "since_s": asked - watch["launched"]}


def judge(
    ranks: dict[int, Rank], in_flight: list[Collective], seen: Pace | None, watch: dict | None, stalled: bool
) -> tuple[Stop | None, list[Collective]]:
    """(the ordinary stop, or None; the collectives that are evidence). `watch`: read_watch()'s."""
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


def last_steps(ranks: Iterable[Rank]) -> list[int]:
    """The distinct last steps the ranks answered with, in order."""
    return sorted({r.answer["last_step"] for r in ranks if r.answer and r.answer.get("last_step")})


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
