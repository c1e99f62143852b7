"""One line per in-process restart, on the console (rank 0's) and in RUN_DIR/restarts.log: which rank, why, when, and
how many seconds passed until the next completed training step.

nvidia-resiliency-ext's Wrapper says on its "nvrx" logger what interrupted a restart iteration: the rank whose
function raised logs `fn_ex: <the exception>`, and every rank then logs `term_ex: RankShouldRestart('Interruption.KIND
affecting ranks {R, ...}')`. A rank that raised leaves its exception and host in RUN_DIR/restarts/rank-R.txt (the
run directory is shared by every node); rank 0 (the active rank 0 of the iteration: the Wrapper renumbers the ranks
through RANK) writes the line once the next step completes, and meanwhile marks the progress record "restarting", so
that srun.sh's hang watch gives the restart the time it gives a start-up.
"""

import dataclasses
import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

from launcher import progress

NVRX_LOGGER = "nvrx"  # nvidia_resiliency_ext.shared_utils.log_manager.LogConfig.name
RAISED = re.compile(r"\bfn_ex: (?P<error>.+)$")
INTERRUPTED = re.compile(r"\bterm_ex: RankShouldRestart\('(?P<why>.*?)'\)")
AFFECTED = re.compile(r"affecting ranks \{(?P<ranks>[0-9, ]*)\}")
LOG_FILE = "restarts.log"


@dataclasses.dataclass
class Pending:
    """A restart seen on this rank whose next completed step has not come yet."""

    why: str
    ranks: list[int]
    at: float  # time.time()
    monotonic: float


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


class RestartLog(logging.Handler):
    def __init__(self, run_dir: Path) -> None:
        super().__init__(level=logging.WARNING)
        self.run_dir = run_dir
        self.count = 0
        self.pending: Pending | None = None

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if raised := RAISED.search(message):
            self.leave_own_error(raised["error"])
        elif (interrupted := INTERRUPTED.search(message)) and self.pending is None:
            self.restart_seen(interrupted["why"])

    def leave_own_error(self, error: str) -> None:
        folder = self.run_dir / "restarts"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"rank-{rank()}.txt").write_text(f"{socket.gethostname()}: {error}\n")

    def restart_seen(self, why: str) -> None:
        affected = AFFECTED.search(why)
        ranks = sorted(int(r) for r in affected["ranks"].split(",") if r.strip()) if affected else []
        self.pending = Pending(why, ranks, time.time(), time.monotonic())
        if rank() == 0:
            progress.Recorder(self.run_dir, 0).record(progress.LAST.step or 0, "restarting")

    def step_completed(self, step: int) -> str | None:
        """The restart's line, once its next step completed (rank 0 only); None otherwise."""
        pending, self.pending = self.pending, None
        if pending is None:
            return None
        self.count += 1
        if rank() != 0:
            return None
        line = describe(self.count, pending, self.errors(pending.ranks), step, time.monotonic() - pending.monotonic)
        with (self.run_dir / LOG_FILE).open("a") as log:
            log.write(line + "\n")
        return line

    def errors(self, ranks: list[int]) -> dict[int, str]:
        found = {}
        for affected in ranks:
            path = self.run_dir / "restarts" / f"rank-{affected}.txt"
            if path.exists():
                found[affected] = path.read_text().strip()
                path.unlink()
        return found


def describe(count: int, pending: Pending, errors: dict[int, str], step: int, seconds: float) -> str:
    when = time.strftime("%H:%M:%S", time.localtime(pending.at))
    ranks = ", ".join(str(r) for r in pending.ranks) or "unknown"
    kind = pending.why.split(" ")[0].removeprefix("Interruption.")
    causes = "; ".join(f"rank {r} on {text}" for r, text in errors.items())
    return (
        f"restart {count} at {when}: rank(s) {ranks}, {kind}{f' ({causes})' if causes else ''};"
        f" step {step} completed {seconds:.1f} s later"
    )


def install(run_dir: Path) -> RestartLog:
    """NVRx sets up its logger's own console handler only while the logger has none: set up first, then added to."""
    from nvidia_resiliency_ext.shared_utils.log_manager import setup_logger

    setup_logger()
    handler = RestartLog(run_dir)
    logging.getLogger(NVRX_LOGGER).addHandler(handler)
    return handler


def register(callbacks: progress.Registry, run_dir: Path) -> None:
    """The restart lines, from Megatron Bridge's training callbacks (the callback manager outlives a restart)."""
    handler = install(run_dir)

    def step_end(context: Any) -> None:
        line = handler.step_completed(context.state.train_state.step + 1)
        if line is not None:
            print(f"entrypoint.py: {line}", flush=True)

    callbacks.register("on_train_step_end", step_end)
