"""A launch's wall time split into its parts, into RUN_DIR/goodput.json and one line (docs/failures.md). Stdlib only."""

import dataclasses
import json
import re
import statistics
import time
from pathlib import Path

from launcher.hang.progress import TIMELINE_FILE, read_json, write_json
from launcher.run_files import read_text

PARTS = ("start_up", "steps", "checkpoints", "restarts", "retrained", "waiting", "clean_up")
RECORD = re.compile(r"\s*(\d+\.?\d*)\s+(\d+)\s+(training|saving|saved|restarting|ended)\s*")  # progress.py's
SKEW_S = 60.0  # a record further outside the launch than hosts' clocks disagree is a line cut off mid-write
RESTART_LINE = re.compile(r"; step (\d+) completed ([0-9.]+) s later$")  # launcher/restart/log.py's
Record = tuple[float, int, str]


@dataclasses.dataclass
class Completion:
    step: int
    end: float
    seconds: float
    lead: tuple[float, str] | None = None  # the first step after the start or a fault: its stretch, and whose it is
    lost_to: dict | None = None  # the fault whose restart trained this step again


def read_timeline(path: Path, start: float, end: float) -> list[Record]:
    """The launch's records, in order, clamped into it; a line cut off by a rank killed mid-write is left out."""
    found = [(float(m[1]), int(m[2]), m[3]) for m in map(RECORD.fullmatch, read_text(path).splitlines()) if m]
    inside = [(min(max(at, start), end), *rest) for at, *rest in found if start - SKEW_S <= at <= end + SKEW_S]
    return sorted(inside, key=lambda record: record[0])


def split(start: float, end: float, records: list[Record], ended: str, restart_lines: list[str]) -> dict:
    """The attempt: its parts, faults, saves, first step's start and the steps that count."""
    seconds, steps, faults, saves = dict.fromkeys(PARTS, 0.0), [], [], []
    said = {int(m[1]): float(m[2]) for line in restart_lines if (m := RESTART_LINE.search(line))}  # a step's last line
    pending, last, phase = "start_up", start, ""  # pending: the part of the stretch before the next completed step
    for at, step, phase in records:
        gap, last = at - last, at
        if phase == "restarting":  # the stretch before it: the step it interrupted, or what was pending
            seconds[pending or "restarts"] += gap
            faults.append({"at": at, "to_next_step_s": None, "retrained_steps": 0, "retrained_s": 0.0})
            pending = "restarts"
        elif phase == "saved":
            seconds["checkpoints"] += gap
            saves.append({"step": step, "blocked_s": gap})
        elif phase != "ended" and (pending or step != steps[-1].step):
            steps.append(Completion(step, at, 0.0, (gap, pending)) if pending else Completion(step, at, gap))
            if pending == "restarts":
                resumed(steps, faults, said.get(step))
            pending = ""
        else:  # the end of training, or an evaluation after its step
            seconds[pending or ("clean_up" if phase == "ended" else "steps")] += gap
    done = phase in ("ended", "saved") or (ended == "completed" and not pending)
    seconds["clean_up" if done else pending or "waiting"] += end - last
    typical = statistics.median([step.seconds for step in steps if not step.lead] or [0.0])
    for step in steps:
        if step.lead:
            step.seconds += min(step.lead[0], typical)
            seconds[step.lead[1]] += step.lead[0] - min(step.lead[0], typical)
        seconds["retrained" if step.lost_to else "steps"] += step.seconds
        if step.lost_to:
            step.lost_to["retrained_steps"] += 1
            step.lost_to["retrained_s"] += step.seconds
    counted = [step.step for step in steps if not step.lost_to]
    first_step_at = steps[0].end - min(steps[0].lead[0], typical) if steps else None
    return {"start": start, "end": end, "ended": ended, "seconds": seconds, "faults": faults, "saves": saves,
            "first_step_at": first_step_at, "steps": [min(counted), max(counted)] if counted else None}  # fmt: skip


def resumed(steps: list[Completion], faults: list[dict], said_s: float | None) -> None:
    """The restarts before the last step resumed at it (its line: SAID_S after the fault): the steps on lost to them."""
    waiting = [fault for fault in faults if fault["to_next_step_s"] is None]
    waiting[0]["at"] = min(waiting[0]["at"], steps[-1].end - (said_s or 0.0))  # before rank 0 saw it
    for fault in waiting:
        fault["to_next_step_s"] = steps[-1].end - fault["at"]
    for earlier in reversed(steps[:-1]):  # those that count rise: the first below the resume ends the search
        if not earlier.lost_to and earlier.step < steps[-1].step:
            return
        earlier.lost_to = earlier.lost_to or faults[-1]


def total(attempts: list[dict]) -> dict:
    """The run's: the attempts' parts, an earlier one's steps that a later one trained again moved to "retrained"."""
    run = {part: sum(attempt["seconds"][part] for attempt in attempts) for part in PARTS}
    run["faults"] = sum(len(attempt["faults"]) for attempt in attempts)
    run["retrained_steps"] = sum(fault["retrained_steps"] for attempt in attempts for fault in attempt["faults"])
    wall, before_first, kept = 0.0, None, []  # kept: [first, last, mean s] of each attempt's steps that still count
    for attempt in attempts:
        if attempt["steps"]:
            first, last = attempt["steps"]
            for earlier in kept:
                lost = max(0, earlier[1] - max(earlier[0], first) + 1)
                run["steps"], run["retrained"] = run["steps"] - lost * earlier[2], run["retrained"] + lost * earlier[2]
                run["retrained_steps"], earlier[1] = run["retrained_steps"] + lost, min(earlier[1], first - 1)
            kept.append([first, last, attempt["seconds"]["steps"] / (last - first + 1)])
            before_first = wall + attempt["first_step_at"] - attempt["start"] if before_first is None else before_first
        wall += attempt["end"] - attempt["start"]
    after = wall - before_first if before_first is not None else 0.0  # the shares: at most 1, rounded to 1 ms
    run["goodput"], run["goodput_all"] = (min(1.0, run["steps"] / of) if of > 0 else 0.0 for of in (after, wall))
    return {"wall_s": wall, "after_first_step_s": after, **run}


def line(run: dict, path: Path) -> str:
    s = {part: f"{run[part]:.0f} s" for part in PARTS}
    head = f": no training step completed in {run['wall_s']:.0f} s"
    if run["after_first_step_s"] > 0:
        head = f" {run['goodput']:.1%} of {run['after_first_step_s']:.0f} s after the first step"
        head += f" ({run['goodput_all']:.1%} of all)"
    lost = f"{run['faults']} fault(s) {run['restarts'] + run['retrained']:.0f} s (restarts {s['restarts']}"
    lost += f", {run['retrained_steps']} step(s) trained again {s['retrained']})"
    parts = f"start-up {s['start_up']}, steps {s['steps']}, checkpoints {s['checkpoints']}, {lost}"
    return f"srun.sh: goodput{head}: {parts}, waiting {s['waiting']}, clean-up {s['clean_up']} ({path})"


def account(run_dir: Path, start: float, ended: str) -> None:
    """The launch that started at START and ends now as ENDED says, into RUN_DIR/goodput.json; then the run's line."""
    end, path = time.time(), run_dir / "goodput.json"
    records = read_timeline(run_dir / "hang" / TIMELINE_FILE, start, end)
    attempt = split(start, end, records, ended, read_text(run_dir / "restarts.log").splitlines())
    rounded = json.loads(json.dumps(attempt), parse_float=lambda text: round(float(text), 3))  # to 1 ms
    attempts = [*(read_json(path) or {}).get("attempts", []), rounded]
    run = total(attempts)
    write_json(path, {"attempts": attempts, "total": {key: round(value, 3) for key, value in run.items()}})
    print(line(run, path), flush=True)
