"""Where each line srun or torchrun print goes: RUN_DIR/logs/launcher.log, the console, or both (docs/launch.md)."""

import re
from collections.abc import Callable
from typing import BinaryIO

CONSOLE_LOCAL = re.compile(rb"^([0-9]+|srun\.sh): ")
LOG_ONLY = re.compile(
    rb"^(srun: error: [^ ]+: tasks? [0-9,-]+: (Exited with exit code [0-9]+|Terminated|Killed)$"
    rb"|slurmstepd(-[^:]+)?: "
    rb"|srun: (launch/slurm: _step_signal: Terminating StepId|Job step aborted|forcing job termination"
    rb"|Force Terminated|got SIGCONT|error: (pyxis|spank)))"
)
SRUN = re.compile(rb"^srun: ")


def destinations(line: bytes, local: bool) -> tuple[bool, bool]:
    """Whether LINE (without its newline) goes to the console, and whether to the log."""
    if local:
        console = CONSOLE_LOCAL.match(line) is not None
        return console, not console
    if LOG_ONLY.match(line):
        return False, True
    return True, SRUN.match(line) is not None


def pass_on(source: BinaryIO, console: Callable[[bytes], object], log: BinaryIO, local: bool) -> None:
    for line in iter(source.readline, b""):
        to_console, to_log = destinations(line.rstrip(b"\n"), local)
        for wanted, write in ((to_log, log.write), (to_console, console)):
            if wanted:
                write(line)
        log.flush()
