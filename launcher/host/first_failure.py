"""srun.sh's report, on stderr, of a launch that ended badly (docs/failures.md, "In the code")."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from launcher.errors import say
from launcher.host.slurm import job_state
from launcher.run_files import RankEnd, rank_ends

TASK_EXIT = re.compile(rb": tasks? [0-9,-]+: Exited with exit code [0-9]+$")
CANCELLED = re.compile(rb"\*\*\* (STEP|JOB) ([0-9.]+) ON .* CANCELLED AT")
LINES_SHOWN = 20


def indented(lines: list[bytes]) -> bytes:
    return b"".join(b"    " + line + b"\n" for line in lines)


def lines_of(data: bytes) -> list[bytes]:
    """DATA's lines, split on newlines only, as the shell's tools split them."""
    lines = data.split(b"\n")
    return lines[:-1] if lines[-1] == b"" else lines


def log_end(path: Path) -> bytes:
    """PATH's last lines, indented (as tail -n 20: a last line without its newline stays without one)."""
    data = path.read_bytes()
    shown = indented(lines_of(data)[-LINES_SHOWN:])
    return shown if data.endswith(b"\n") or not data else shown[:-1]


def launch_notes(log: Path, start: int, local: bool) -> list[bytes]:
    """This launch's lines of launcher.log; under SLURM each once (pyxis and slurmstepd say the same on every node)."""
    try:
        with log.open("rb") as file:
            file.seek(start - 1)
            lines = lines_of(file.read())
    except OSError:
        return []
    return lines if local else list(dict.fromkeys(lines))


def report_stopped_from_outside(notes: list[bytes], first: RankEnd, local: bool) -> None:
    """Every rank that ended was stopped from outside (scancel, preemption, a limit): say so, not a rank's failure."""
    cancelled = [found for line in notes if (found := CANCELLED.search(line))][:5]
    steps = [found.group(2) for found in cancelled if found.group(1) == b"STEP"]
    what = f"job step {os.fsdecode(steps[0])}" if steps else "every rank"
    job = os.environ.get("SLURM_JOB_ID", "")
    state = "" if local else f"job {job} is {job_state(job)}; "
    first_stop = f"rank {first.rank} on {first.host} first, with exit status {first.status}"
    say(
        f"srun.sh: {what} was stopped from outside srun.sh, no rank failed on its own ({state}every rank ended by a"
        f" signal, {first_stop}){':' if cancelled else ''}"
    )
    sys.stderr.buffer.write(indented([found.string for found in cancelled]))


def report(run_dir: Path, log_start: int, local: bool) -> int | None:
    """The report; srun.sh's exit status (the first failed rank's; 2: every rank's error), or None if no rank ended."""
    logs = run_dir / "logs"
    usage_error = logs / "usage-error"
    if usage_error.is_file() and usage_error.stat().st_size:
        sys.stderr.buffer.write(usage_error.read_bytes())
        return 2
    ends = rank_ends(logs)
    notes = launch_notes(logs / "launcher.log", log_start, local)
    if not ends:  # none started, or none could record its end: what srun or torchrun said holds the cause
        if said := [line for line in notes if not TASK_EXIT.search(line)][-LINES_SHOWN:]:
            launcher = "torchrun" if local else "srun"
            say(f"srun.sh: the launch failed before any rank started; {launcher} said ({logs / 'launcher.log'}):")
            sys.stderr.buffer.write(indented(said))
        return None
    first = ends[0]
    failed = f"srun.sh: rank {first.rank} on {first.host} failed first, with exit status {first.status}"
    rank_log = logs / f"rank-{first.rank}.log"
    if first.stopped:
        report_stopped_from_outside(notes, first, local)
    elif rank_log.exists():
        say(f"{failed}; the end of {rank_log}:")
        sys.stderr.buffer.write(log_end(rank_log))
    else:
        say(f"{failed}, before it wrote a log")
    return first.status
