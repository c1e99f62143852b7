"""srun.sh's hang watch: a supervisor thread that calls back when no step completed for too long (docs/health.md)."""

import threading
import time
from collections.abc import Callable
from pathlib import Path

from launcher.hang.progress import PROGRESS_FILE, read_json, write_json

START_LIMIT_S = 1200.0
FLOOR_S = 300.0
FACTOR = 10.0
POLL_S = 1.0


class StallClock:
    """When the watch fires, on this host's monotonic clock (so that other hosts' clocks never matter)."""

    def __init__(self, fixed_s: float | None, now: float) -> None:
        self.fixed_s = fixed_s
        self.last: dict | None = None  # the last record
        self.last_change = now  # when it came, or the start
        self.longest_gap = 0.0

    def limit(self) -> float:
        if self.last is None or self.last.get("phase") == "restarting":  # an in-process restart starts up again
            return max(START_LIMIT_S, self.fixed_s or 0.0)
        return self.fixed_s if self.fixed_s is not None else max(FLOOR_S, FACTOR * self.longest_gap)

    def observe(self, record: dict | None, now: float) -> str | None:
        """Why the ranks count as hung now, or None."""
        if record is not None and record != self.last:
            if self.last is not None and self.last.get("phase") == "training":
                self.longest_gap = max(self.longest_gap, now - self.last_change)
            self.last, self.last_change = record, now
        since = now - self.last_change
        if (self.last or {}).get("phase") in ("saving", "ended") or since <= self.limit():
            return None
        if self.last is None:
            limit = f"the limit before the first step, {self.limit():g} s"
            return f"no training step completed in the {since:.0f} s since the launch ({limit})"
        if self.fixed_s is not None:
            limit = f"SRUNSH_HANG_TIMEOUT_S={self.fixed_s:g}"
        else:
            gap = f"{self.longest_gap:.0f} s"
            limit = f"the limit: {FACTOR:g} x the longest time between steps so far ({gap}), at least {FLOOR_S:g} s"
        return f"no training step completed for {since:.0f} s after step {self.last.get('step')} ({limit})"


def write_limit(hang: Path, launched: float, limit_s: float) -> None:
    hang.mkdir(parents=True, exist_ok=True)
    write_json(hang / "watch.json", {"launched": launched, "limit_s": limit_s})


def watch(run_dir: Path, fixed_s: float | None, on_stall: Callable[[str], None], stop: threading.Event) -> None:
    """Until `stop` is set, or a stall: stalled.txt says why, on_stall(why) once; fixed_s: SRUNSH_HANG_TIMEOUT_S."""
    hang = run_dir / "hang"
    clock = StallClock(fixed_s, time.monotonic())
    launched, written = time.time(), None
    while not stop.is_set():
        if clock.limit() != written:
            written = clock.limit()
            write_limit(hang, launched, written)
        if (why := clock.observe(read_json(hang / PROGRESS_FILE), time.monotonic())) is not None:
            hang.mkdir(parents=True, exist_ok=True)
            (hang / "stalled.txt").write_text(why + "\n")
            on_stall(why)
            return
        stop.wait(POLL_S)
