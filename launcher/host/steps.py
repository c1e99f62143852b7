"""Running one launch command (the srun step, torchrun, or the health check around its step) and stopping its
ranks.

What srun or torchrun print on stderr goes to RUN_DIR/logs/launcher.log, the console, or both (launcher/host/notes.py),
through a thread that outlives a stop, so the launch's last words are kept.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from launcher.host.notes import pass_on
from launcher.host.slurm import config, launch_step
from launcher.run_files import private_files

POLL_S = 0.1


def kill_wait_s() -> int:
    """The cluster's grace period between SIGTERM and SIGKILL (KillWait, "30 sec"); torchrun's 30 s without one."""
    value = config("KillWait")
    return 30 if value is None else int(re.match("[0-9]*", value).group() or 0)


class Step:
    """One launch command, run to its end; `stop` sends its ranks SIGTERM."""

    def __init__(self, command: list[str], log: Path, local: bool) -> None:
        self.command, self.log, self.local = command, log, local
        self.process: subprocess.Popen[bytes] | None = None
        self.log_start = 1

    def run(self, each_poll: Callable[[], object] = lambda: None) -> int:
        """Runs the command to its end, calling EACH_POLL in this thread meanwhile."""
        with private_files():
            log = open(self.log, "ab")  # closed by the notes thread
        self.log_start = log.tell() + 1  # this launch's lines of launcher.log start here
        # torchrun gets a session of its own, so that a terminal's Ctrl-C reaches the ranks once, as srun.sh's SIGTERM.
        self.process = subprocess.Popen(self.command, stderr=subprocess.PIPE, start_new_session=self.local)
        notes = threading.Thread(target=keep_notes, args=(self.process.stderr, log, self.local), daemon=True)
        notes.start()
        while self.process.poll() is None:
            each_poll()
            time.sleep(POLL_S)
        notes.join()
        code = self.process.returncode
        return 128 - code if code < 0 else code  # as the shell gives it: 128+N for a signal

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, job_id: str, step_name: str, to_save: bool = False) -> None:
        """SIGTERM to every rank, SIGKILL to what is left after the grace period; TO_SAVE: no SIGKILL, the ranks save
        a checkpoint before the time limit (SLURM kills what is left at the limit)."""
        step = "" if self.local else launch_step(job_id, step_name)
        if not step:  # torchrun, or srun before its step exists (it then cancels its request)
            if self.alive():
                assert self.process is not None
                self.process.send_signal(signal.SIGTERM)
            return
        subprocess.run(["scancel", "--signal=TERM", step], check=False)
        if to_save:
            return
        deadline = time.monotonic() + kill_wait_s()
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        subprocess.run(["scancel", step], stderr=subprocess.DEVNULL, check=False)


def keep_notes(source: BinaryIO, log: BinaryIO, local: bool) -> None:
    with log:
        pass_on(source, sys.stderr.buffer, log, local)
