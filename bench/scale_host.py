"""The launching host's steps as bench/bench_scale.py runs them, each one process (`python3 -S bench/scale_host.py
STEP ...`: the standard library only, as the host needs), and the stand-ins for what the ranks do meanwhile:

    measure OUT LIMIT -- COMMAND...   COMMAND under LIMIT bytes of address space; OUT gets its exit status, seconds,
                                      CPU seconds and peak memory (wait4's: its own and its waited-for children's;
                                      forked from this small process, whose pages it starts with)
    hang-report WAIT_S -- ARGS        launcher/hang/report.py ARGS as the supervisor starts it; WAIT_S is the longest
                                      wait for an answer
    health-report -- ARGS             launcher/health/report.py ARGS
    answer STAGED HANG                the stand-in scancel: each rank's answer, as bench/scale_tree.py staged it
    health-launch STAGED HEALTH S     the health check's launch: the ranks' records into place, its end S s later
    start-up LINES SRUN_ARGS...       the stand-in srun of a start-up: each rank prints the same LINES lines

The two reports write to $SCALE_SPENT the seconds they waited for the ranks (signalling them and waiting for their
answers; the health check's launch): the ranks' time, not the host's.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

START_UP = ("> a line of every rank's start-up, ", "/opt/megatron/setup.py:9: UserWarning: every rank warns, ")
if not __package__:  # run as a script: the repository, one folder up, holds the launcher
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@contextlib.contextmanager
def set_aside(*functions: tuple[Any, str]) -> Iterator[None]:
    """Each MODULE.NAME adds the seconds of its calls to what $SCALE_SPENT gets at the end, whatever happens."""
    spent: list[float] = []

    def timed(function: Callable) -> Callable:
        def measured(*args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                return function(*args, **kwargs)
            finally:
                spent.append(time.monotonic() - started)

        return measured

    for module, name in functions:
        setattr(module, name, timed(getattr(module, name)))
    try:
        yield
    finally:
        Path(os.environ["SCALE_SPENT"]).write_text(json.dumps(sum(spent)))


def hang_report(wait_s: str, _: str, *args: str) -> int:
    from launcher.hang import answers, report

    answers.ANSWER_WAIT_S = float(wait_s)
    sys.argv = [str(report.__file__), *args]
    with set_aside((answers, "signal_step"), (answers, "wait_for_answers")):
        return report.main()


def health_report(_: str, *args: str) -> int:
    from launcher.health import report

    sys.argv = [str(report.__file__), *args]
    with set_aside((report, "launch")):
        return report.main()


def measure(out: str, limit: str, _: str, *command: str) -> int:
    resource.setrlimit(resource.RLIMIT_AS, (int(limit), int(limit)))  # this process's, and so the command's
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(command[0], list(command))
        finally:
            os._exit(127)  # it could not be started
    _, status, usage = os.wait4(pid, 0)
    seconds = time.monotonic() - started
    result = {"status": os.waitstatus_to_exitcode(status), "seconds": seconds, "peak_bytes": usage.ru_maxrss * 1024}
    result["cpu_seconds"] = usage.ru_utime + usage.ru_stime
    Path(out).write_text(json.dumps(result))
    return 0


def answer(staged: str, hang: str) -> int:
    """Each staged rank's answer into HANG, in the order a rank writes it: stacks (appended, as faulthandler does),
    flight recorder, answer."""
    source, target = Path(staged), Path(hang)
    for stacks in source.glob("stacks-rank-*.txt"):
        rank = stacks.name.removeprefix("stacks-rank-").removesuffix(".txt")
        with open(target / stacks.name, "ab") as out:
            out.write(stacks.read_bytes())
        os.replace(source / "fr" / f"rank-{rank}", target / "fr" / f"rank-{rank}")
        os.replace(source / f"answer-rank-{rank}.json", target / f"answer-rank-{rank}.json")
    return 0


def health_launch(staged: str, health: str, end_s: str) -> int:
    """The records at once (a folder renamed over the empty one the report made), then the launch's end."""
    os.rename(staged, health)
    time.sleep(float(end_s))
    return 0


def start_up(lines: str, *srun: str) -> int:
    """Each of srun's --ntasks ranks prints the same LINES lines, labelled as launcher/rank/rank.sh labels them, every
    rank a line in turn; each tenth a warning, on stderr as Python prints one."""
    ranks = int(next(word for word in srun if word.startswith("--ntasks=")).removeprefix("--ntasks="))
    for number in range(int(lines)):
        out = sys.stderr if number % 10 == 9 else sys.stdout
        out.write("".join(f"{rank}: {START_UP[number % 10 == 9]}{number}\n" for rank in range(ranks)))
    return 0


STEPS: dict[str, Callable[..., int]] = {
    "measure": measure,
    "hang-report": hang_report,
    "health-report": health_report,
    "answer": answer,
    "health-launch": health_launch,
    "start-up": start_up,
}


if __name__ == "__main__":
    raise SystemExit(STEPS[sys.argv[1]](*sys.argv[2:]))
