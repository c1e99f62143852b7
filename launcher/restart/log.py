"""One line per in-process restart, on the console and in RUN_DIR/restarts.log (docs/failures.md, "In the code")."""

import dataclasses
import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import Any, TextIO

from launcher.hang import progress

NVRX_LOGGER = "nvrx"  # nvidia_resiliency_ext.shared_utils.log_manager.LogConfig.name
RAISED = re.compile(r"\bfn_ex: (?P<error>.+)$")
INTERRUPTED = re.compile(r"\bterm_ex: RankShouldRestart\('(?P<why>.*?)'\)")
RESTARTING = re.compile(r"\brestart_ex: HealthCheckPassed\(")
AFFECTED = re.compile(r"Interruption\.(?P<kind>\w+) affecting ranks \{(?P<ranks>[0-9, ]*)\}")
ERROR_CHARS = 160
LOG_FILE = "restarts.log"


@dataclasses.dataclass
class Pending:
    """A restart seen on this rank whose next completed step has not come yet."""

    groups: list[tuple[str, list[int]]]  # NVRx's (interruption kind, ranks), the cause first
    at: float  # time.time()
    last_step: int  # the last step completed before it


def rank() -> int | None:
    """This process's active rank; None for a warm spare, whose RANK the Wrapper sets to "None"."""
    value = os.environ.get("RANK", "0")
    return int(value) if value.isdigit() else None


class RestartLog(logging.Handler):
    def __init__(self, run_dir: Path) -> None:
        super().__init__(level=logging.INFO)
        self.run_dir = run_dir
        self.folder = run_dir / "restarts"  # each rank that raised: "WHEN HOST: ERROR" in rank-R.txt
        self.count = 0
        self.pending: Pending | None = None

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if raised := RAISED.search(message):
            self.folder.mkdir(parents=True, exist_ok=True)
            said = f"{time.time()} {socket.gethostname()}: {raised['error']}\n"
            (self.folder / f"rank-{rank()}.txt").write_text(said)
        elif (interrupted := INTERRUPTED.search(message)) and self.pending is None:
            self.restart_seen(interrupted["why"])
        elif RESTARTING.search(message) and self.pending is None:
            self.restart_seen("")  # the warning above was filtered: the ranks that raised say who (step_completed)

    def restart_seen(self, why: str) -> None:
        groups = [(m["kind"], sorted(map(int, re.findall("[0-9]+", m["ranks"])))) for m in AFFECTED.finditer(why)]
        # A rank that died or stopped answering comes first: the exceptions beside it are its peers' failed collectives.
        groups.sort(key=lambda group: group[0] == "EXCEPTION")
        self.pending = Pending(groups, time.time(), progress.LAST.step or 0)
        if rank() == 0:
            progress.Recorder(self.run_dir, 0).record(progress.LAST.step or 0, "restarting")

    def step_completed(self, step: int, save_dir: str | None = None) -> str | None:
        """The restart's line, once its next step completed (rank 0 only); None otherwise."""
        pending, self.pending = self.pending, None
        if pending is None:
            return None
        self.count += 1
        if rank() != 0:
            return None
        raised = sorted(int(r) for p in self.folder.glob("rank-*.txt") if (r := p.stem.removeprefix("rank-")).isdigit())
        if not pending.groups and raised:  # the ranks that raised, where NVRx's warning named none
            pending.groups = [("EXCEPTION", raised)]
        errors = self.errors([affected for _, ranks in pending.groups for affected in ranks])
        # From the fault: the failed rank's own time of it, where it left one (hosts' clocks agree to NTP's accuracy).
        pending.at = min([pending.at, *(at for at, _ in errors.values())])
        causes = {affected: text for affected, (_, text) in errors.items()}
        line = describe(
            self.count, pending, causes, step, time.time() - pending.at, resumed=resumed_from(step - 1, save_dir)
        )
        with (self.run_dir / LOG_FILE).open("a") as log:
            log.write(line + "\n")
        return line

    def errors(self, ranks: list[int]) -> dict[int, tuple[float, str]]:
        """When each affected rank that raised did, and 'HOST: ERROR'."""
        found = {}
        for affected in ranks:
            path = self.folder / f"rank-{affected}.txt"
            if path.exists():
                at, _, text = path.read_text().strip().partition(" ")
                found[affected] = (float(at), text)
                path.unlink()
        return found


def resumed_from(step: int, save_dir: str | None) -> str:
    """Which checkpoint training went on from, at STEP: Megatron Bridge loads the newest, local or persistent."""
    if step == 0:
        return "no checkpoint: from the start"
    persistent = save_dir is not None and (Path(save_dir) / f"iter_{step:07d}").is_dir()
    return f"the {'persistent' if persistent else 'local'} checkpoint of step {step}"


def describe(count: int, pending: Pending, errors: dict[int, str], step: int, seconds: float, *, resumed: str) -> str:
    when = time.strftime("%H:%M:%S", time.localtime(pending.at))
    parts = []
    for kind, ranks in pending.groups or [("unknown interruption", [])]:
        causes = "; ".join(f"rank {r} on {errors[r][:ERROR_CHARS]}" for r in ranks if r in errors)
        parts.append(f"rank(s) {', '.join(map(str, ranks)) or '?'} {kind}{f' ({causes})' if causes else ''}")
    again = max(pending.last_step - (step - 1), 0)
    return (
        f"restart {count} at {when}: {'; then '.join(parts)}; resumed from {resumed} ({again} step(s) trained again);"
        f" step {step} completed {seconds:.1f} s later"
    )


def say(line: str, stream: TextIO | None = None) -> None:
    """A line of the rank's own, on stdout unless STREAM says otherwise."""
    print(f"entrypoint.py: {line}", file=stream, flush=True)


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
        step, save_dir = context.state.train_state.step + 1, context.state.cfg.checkpoint.save
        if (line := handler.step_completed(step, save_dir)) is not None:
            say(line)

    callbacks.register("on_train_step_end", step_end)
