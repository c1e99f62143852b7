"""The console a person reads; each rank's whole output is in RUN_DIR/logs/rank-R.log (launcher/rank/rank.sh). Of the
lines srun or torchrun pass on labelled "R: ", it shows those of the ranks SRUNSH_CONSOLE_RANKS names (default: 0, where
Megatron prints, and the last, where it prints its iterations) and the other ranks' problems: a line waits WINDOW_S
from its first sighting, then "ranks 1-5,7: LINE" names the ranks it came from meanwhile. A line shown is not shown
again for HOLD_S, whichever rank prints it; lines are compared without what differs from rank to rank in a message
(torch's "[rankN]: ", c10's time, NCCL's host:pid:tid [device], C++ frames' addresses); a traceback is one block."""

from __future__ import annotations

import re
import threading
import time
from typing import BinaryIO

from launcher.errors import UsageError, q
from launcher.hang.collectives import ranges

WINDOW_S, HOLD_S, BLOCK_LINES = 1.0, 300.0, 200
LABEL = re.compile(rb"(\d+): ")
PROBLEM = re.compile(rb"(?i)warn|error|exception|traceback|fatal|\bfault|abort|fail|killed|^(\[rank\d+\]:)?\[[WEF]\d")
PER_RANK = re.compile(rb"^(?:\[rank\d+\]: ?)?(?:[\w.-]+:\d+:\d+ \[\d+\] (?=NCCL )|(\[[WEIF])\d{4} [\d:.]+)?")
ADDRESS = re.compile(rb"0x[0-9a-f]{8,}")


def shown_ranks(spec: str, world: int) -> frozenset[int] | None:
    """The ranks SPEC (SRUNSH_CONSOLE_RANKS, its form checked by preflight) names in a job of WORLD; None: all."""
    if spec == "all":
        return None
    bounds = [(int(a), int(b or a)) for a, _, b in (part.partition("-") for part in spec.split(","))] if spec else []
    ranks = frozenset(r for a, b in bounds or [(0, 0), (world - 1, world - 1)] for r in range(a, min(b, world - 1) + 1))
    if not ranks:
        raise UsageError(
            f"SRUNSH_CONSOLE_RANKS={q(spec)} names no rank of this job (ranks 0-{world - 1}): name some of them, or all"
        )
    return ranks


def same_text(text: bytes) -> bytes:
    return ADDRESS.sub(b"0x...", PER_RANK.sub(rb"\1", text, 1))


class Console:
    """One step's console: `line` takes each line srun or torchrun print, `tick` shows the groups that are due."""

    def __init__(self, shown: frozenset[int] | None) -> None:
        self.shown, self.lock = shown, threading.Lock()
        self.said: dict[bytes, tuple[int | None, float]] = {}  # a line shown: its rank (None: a group's), when
        self.waiting: dict[bytes, tuple[BinaryIO, set[int], float]] = {}  # a group: its sink, ranks, when it is due
        self.blocks: dict[tuple[BinaryIO, int], list[bytes]] = {}  # the traceback a rank is printing

    def pass_on(self, source: BinaryIO, sink: BinaryIO) -> None:
        for line in iter(source.readline, b""):
            self.line(line, sink)

    def line(self, line: bytes, sink: BinaryIO) -> None:
        """LINE, bound for SINK: as it is unless it is a rank's."""
        label = LABEL.match(line)
        if label is None or self.shown is None:
            sink.write(line)
            sink.flush()
            return
        rank, text = int(label[1]), line[label.end() :].rstrip(b"\n")
        with self.lock:
            block, shown = self.blocks.get((sink, rank)), rank in self.shown
            if block is None and not shown and (text[:1].isspace() or not PROBLEM.search(text)):
                return  # most lines of most ranks, and a warning's source line: in their logs only
            plain = same_text(text)
            if block is not None or plain.startswith(b"Traceback (most recent call last):"):
                block = self.blocks.setdefault((sink, rank), [])
                block.append(text)
                if len(block) == 1 or (plain[:1].isspace() and len(block) < BLOCK_LINES):
                    return  # the traceback goes on, up to its exception's line
                text = b"\n".join(self.blocks.pop((sink, rank)))
            self.take(sink, rank, text)

    def take(self, sink: BinaryIO, rank: int, text: bytes) -> None:
        key = b"\n".join(map(same_text, text.split(b"\n")))
        if self.said.get(key, (rank,))[0] != rank:
            return  # shown already, for another rank
        if rank in (self.shown or ()):
            self.waiting.pop(key, None)  # said by a shown rank in time: no group line
            self.say(sink, f"{rank}: ", text, key, rank)
        else:
            self.waiting.setdefault(key, (sink, set(), time.monotonic() + WINDOW_S))[1].add(rank)

    def say(self, sink: BinaryIO, label: str, text: bytes, key: bytes, rank: int | None) -> None:
        sink.write(b"".join(label.encode() + part + b"\n" for part in text.split(b"\n")))
        sink.flush()
        self.said.pop(key, None)  # the oldest first, for tick
        self.said[key] = (rank, time.monotonic())

    def tick(self, end: bool = False) -> None:
        """Shows the groups that are due (END: all, and each traceback cut short); forgets what was said HOLD_S ago."""
        now = time.monotonic()
        with self.lock:
            for sink, rank in list(self.blocks) if end else ():
                self.take(sink, rank, b"\n".join(self.blocks.pop((sink, rank))))
            for key, (sink, ranks, due) in list(self.waiting.items()):
                if end or due <= now:
                    del self.waiting[key]
                    self.say(sink, f"{'ranks ' if len(ranks) > 1 else ''}{ranges(ranks)}: ", key, key, None)
            while self.said and next(iter(self.said.values()))[1] < now - HOLD_S:
                del self.said[next(iter(self.said))]
