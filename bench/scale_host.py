"""The launching host's steps as bench/bench_scale.py runs them, each one process (`python3 -S bench/scale_host.py
STEP ...`: the standard library only, as the host needs), and the stand-ins for what the ranks do meanwhile.

    hang-report SPENT WAIT_S -- ARGS    launcher/hang/report.py ARGS, as the supervisor starts it; SPENT gets the
                                        seconds of the answers' wait (signalling the ranks, waiting for their answers:
                                        the ranks' time, not the host's), WAIT_S is the longest wait for an answer
    health-report SPENT -- ARGS         launcher/health/report.py ARGS; SPENT gets the seconds of its launch
    first-failure RUN_DIR               the supervisor's first-failure report (launcher/host/first_failure.py)
    read-plan PATH                      the launch plan, read back as a LaunchPlan
    measure OUT LIMIT -- COMMAND...     COMMAND, with at most LIMIT bytes of address space; OUT gets its exit status,
                                        seconds, CPU seconds and peak memory (wait4's: its own and its waited-for
                                        children's; from a fork of this small process, whose pages it starts with)
    answer STAGED HANG                  the ranks answering the hang report (the stand-in scancel runs it): each
                                        rank's stacks, flight recorder and answer, as bench/scale_tree.py staged them
    health-launch STAGED HEALTH S       the health check's launch: the ranks' records into place, then its end S
                                        seconds later, as srun ends after its tasks
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the repository, one folder up, holds the launcher
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from launcher.host.plan import LaunchPlan


def timed(module: Any, name: str, spent: list[float]) -> None:
    """MODULE.NAME, from now on, adds the seconds of each of its calls to SPENT."""
    function = getattr(module, name)

    def measured(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return function(*args, **kwargs)
        finally:
            spent.append(time.monotonic() - started)

    setattr(module, name, measured)


def with_spent(path: str, program: Callable[[list[float]], int]) -> int:
    """PROGRAM's status; PATH gets the seconds it set aside, whatever happens."""
    spent: list[float] = []
    try:
        return program(spent)
    finally:
        Path(path).write_text(json.dumps(sum(spent)))


def hang_report(spent_path: str, wait_s: str, args: list[str]) -> int:
    from launcher.hang import answers, report

    def program(spent: list[float]) -> int:
        timed(answers, "signal_step", spent)
        timed(answers, "wait_for_answers", spent)
        answers.ANSWER_WAIT_S = float(wait_s)
        sys.argv = [str(report.__file__), *args]
        return report.main()

    return with_spent(spent_path, program)


def health_report(spent_path: str, args: list[str]) -> int:
    from launcher.health import report

    def program(spent: list[float]) -> int:
        timed(report, "launch", spent)
        sys.argv = [str(report.__file__), *args]
        return report.main()

    return with_spent(spent_path, program)


def first_failure(run_dir: str) -> int:
    from launcher.host.first_failure import report

    first = report(Path(run_dir), 1, False)
    return 0 if first is None else first


def read_plan(path: str) -> int:
    plan = LaunchPlan(**json.loads(Path(path).read_text()))
    print(f"{len(plan.hosts)} node(s) x {plan.ranks_per_node} rank(s)")
    return 0


def measure(out: str, limit: str, command: list[str]) -> int:
    resource.setrlimit(resource.RLIMIT_AS, (int(limit), int(limit)))  # this process's, and so the command's
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(command[0], command)
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


def main(argv: list[str]) -> int:
    step, args = argv[0], argv[1:]
    if step == "hang-report":
        return hang_report(args[0], args[1], args[3:])
    if step == "health-report":
        return health_report(args[0], args[2:])
    if step == "measure":
        return measure(args[0], args[1], args[3:])
    steps: dict[str, Callable[..., int]] = {
        "first-failure": first_failure,
        "read-plan": read_plan,
        "answer": answer,
        "health-launch": health_launch,
    }
    return steps[step](*args)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
