"""Goodput under faults (issue 67): bench/goodput_recipe.py (bench_startup's llama8b-shape on one GPU), in-process
restart, two arms in turn: A, saving as a user turns it on today, and B, issue 67's proposed defaults; each stopped
(SIGTERM to srun.sh) after --arm-s s. In each, --faults faults at seeded random moments after step 1, --gap-s apart
or more, each once a step completed since the last: SIGUSR1 to the rank, raised as RuntimeError in its training step.
Reported, with issue 67's targets: per fault, seconds to the next step and steps trained again; per save, the steps
around it against the median step; per arm, goodput (RUN_DIR/goodput.json, and from RUN_DIR/hang/timeline.log).
DIR/goodput.{md,json}.
"""

import argparse
import contextlib
import os
import random
import re
import shutil
import signal
import statistics
import time
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import psutil

from bench import bench_startup, launches, report
from launcher.hang.progress import read_json

RECIPE = "bench/goodput_recipe.py"
START_S, STOP_S = 60, 15  # seconds to the first step (38-76 s measured on H200s), and to stop a launch
COMPLETED = ("training", "saving")  # progress.json's phases of a record after a completed step
Record = tuple[float, int, str]  # a line of RUN_DIR/hang/timeline.log: epoch seconds, step, phase
RECORD = re.compile(r"^(\d+(?:\.\d+)?) (\d+) (training|saving|saved|restarting|ended)$", re.MULTILINE)
RAISED = re.compile(r"goodput_recipe: bench fault at ([0-9.]+)")
# Arm A's saving, with its save_interval. Both arms keep the newest persistent checkpoint only: the disk holds two.
TODAY = ("checkpoint.async_save=false", "checkpoint.non_persistent_ckpt_type=null")
KEEP = "checkpoint.most_recent_k=1"
# Arm B's: what issue 67 asks to be the defaults of an in-process restart launch (docs/failures.md says why they are
# not yet); the intervals are left to the launch, which chooses them from each save's measured cost.
PROPOSED = ("checkpoint.async_save=true", "checkpoint.non_persistent_ckpt_type=local")


def overrides(arm: str, save_every: int) -> tuple[str, ...]:
    shape = [o for o in bench_startup.case_command("llama8b-shape", 1, None)[1] if o != bench_startup.STEPS]
    # More steps than an arm reaches before the bench stops it (1.2 s a step on an H200), and not so many that the
    # mock data's index takes long to build.
    ours = ("train.train_iters=5000", "inprocess_restart.enabled=true", "inprocess_restart.granularity=rank", KEEP)
    return (*shape, *ours, *((f"checkpoint.save_interval={save_every}", *TODAY) if arm == "A" else PROPOSED))


def schedule(fractions: list[float], start: float, end: float, gap_s: float) -> list[float]:
    """A moment in [start, end] for each of FRACTIONS (in [0, 1)) that fits, gap_s or more apart, placed by them."""
    count = min(len(fractions), int((end - start) // gap_s) + 1) if end >= start else 0
    room = end - start - (count - 1) * gap_s
    return [start + fraction * room + index * gap_s for index, fraction in enumerate(sorted(fractions)[:count])]


def rank_pid(root: int) -> int | None:
    """The oldest `python3 .../entrypoint.py` below ROOT: the rank, not a worker it forked (nor nvidia-smi's pids)."""
    found = []
    for process in launches.process_tree(root):
        with contextlib.suppress(psutil.Error):
            words = process.cmdline()
            if len(words) > 1 and Path(words[0]).name.startswith("python") and Path(words[1]).name == "entrypoint.py":
                found.append((process.create_time(), process.pid))
    return min(found)[1] if found else None


@dataclass
class Faults:
    """An arm's faults, sent from the polls of its launch; their moments are set when the first step completed."""

    run_dir: Path
    fractions: list[float]
    end: float  # epoch seconds at which the arm is stopped
    gap_s: float
    moments: list[float] | None = None
    sent: list[dict] = field(default_factory=list)

    def poll(self, launch: launches.Launch) -> None:
        progress, now = read_json(self.run_dir / "hang" / "progress.json") or {}, time.time()
        last, step = (self.sent[-1]["sent_at"], self.sent[-1]["after_step"]) if self.sent else (0.0, None)
        if progress.get("phase") not in COMPLETED or progress["step"] == step:
            return  # no step completed since the last fault (a save's own record repeats its step), or none yet
        if self.moments is None:
            self.moments = schedule(self.fractions, now, self.end - self.gap_s, self.gap_s)
            print(f"bench_goodput: faults {[round(m - now, 1) for m in self.moments]} s after step 1", flush=True)
        due = len(self.sent) < len(self.moments) and now >= max(self.moments[len(self.sent)], last + self.gap_s)
        if due and (pid := rank_pid(launch.process.pid)):
            with contextlib.suppress(ProcessLookupError):  # the rank ended meanwhile: no fault
                os.kill(pid, signal.SIGUSR1)
                self.sent.append({"sent_at": now, "after_step": progress["step"]})
                print(f"bench_goodput: fault {len(self.sent)} to pid {pid} after step {progress['step']}", flush=True)


def timeline(text: str) -> list[Record]:
    """timeline.log's records in order; a line cut off or not in the format is left out."""
    return [(float(at), int(step), phase) for at, step, phase in RECORD.findall(text)]


def completions(records: list[Record]) -> list[int]:
    """Indexes of the records of completed steps: a step's first training or saving record, or one after a restart."""
    done, last, restarted = [], None, False
    for index, (_, step, phase) in enumerate(records):
        restarted |= phase == "restarting"
        if phase in COMPLETED and (step != last or restarted):
            done, last, restarted = [*done, index], step, False
    return done


def fault_cost(records: list[Record], done: list[int], at: float) -> dict:
    """The fault raised at AT: seconds to the next step after its restart, steps trained again, the newest save."""
    restart = next((i for i, (t, _, phase) in enumerate(records) if t >= at and phase == "restarting"), -1)
    after = next((i for i in done if records[i][0] > at and i > restart), None)
    cost = {"newest_save": max((s for t, s, phase in records if phase == "saved" and t <= at), default=None)}
    if after is None:
        return cost | {"to_next_step_s": None, "from_step": None, "trained_again": None}
    before, went_on_from = max((records[i][1] for i in done if records[i][0] <= at), default=0), records[after][1] - 1
    cost |= {"to_next_step_s": round(records[after][0] - at, 2), "from_step": went_on_from}
    return cost | {"trained_again": before - went_on_from}


def save_costs(records: list[Record], done: list[int], median: float) -> list[dict]:
    """Each save: seconds it held training (saving to saved), and the steps after it (its own, which it delays, and up
    to two more, which a writer in the background may slow) over as many median steps."""
    found = []
    for index in (i for i in done if records[i][2] == "saving"):
        at, step, _ = records[index]
        later = [i for i in done if i > index][:3]
        until = later[0] if later else len(records)
        held = next((round(t - at, 2) for t, _, phase in records[index:until] if phase == "saved"), None)
        restarted = [i for i in later if "restarting" in {phase for _, _, phase in records[index:i]}]
        span = [i for n, i in enumerate(later) if records[i][1] == step + n + 1 and i not in restarted]
        extra = round(records[span[-1]][0] - at - len(span) * median, 2) if span else None
        found.append({"step": step, "held_s": held, "steps_after": len(span), "extra_s": extra})
    return found


def goodput(records: list[Record], done: list[int], end: float) -> dict:
    """The seconds after step 1 by the timeline alone: new steps, checkpoints, faults (and steps trained again)."""
    best, seconds = records[done[0]][1], dict.fromkeys(("steps", "checkpoints", "faults", "rest"), 0.0)
    for index in range(done[0] + 1, len(records)):
        (before, _, was), (at, step, phase) = records[index - 1], records[index]
        if index in done:
            what, best = "steps" if step > best and was != "restarting" else "faults", max(best, step)
        else:
            what = {"restarting": "faults", "ended": "rest"}.get(phase, "checkpoints")  # "saved", and its record
        seconds[what] += at - before
    seconds["rest"] += end - records[-1][0]
    seconds |= {"goodput": seconds["steps"] / (end - records[done[0]][0])}
    return {key: round(value, 4) for key, value in seconds.items()}


def analyse(run_dir: Path, finished: launches.Finished, started: float, sent: list[dict]) -> dict:
    """What an arm measured by the bench's clock (from the launch command) and by what its run wrote."""
    events = run_dir / "hang" / "timeline.log"
    records = timeline(events.read_text() if events.is_file() else "")
    done, raised = completions(records), [float(m[1]) for _, line in finished.lines if (m := RAISED.search(line))]
    faults = []
    for index, fault in enumerate(sent):  # from the rank's raise, by its clock, where it printed it
        at = raised[index] if index < len(raised) else fault["sent_at"]
        faults.append({**fault, "raised_at": at, **fault_cost(records, done, at)})
    steps = [records[j][0] - records[i][0] for i, j in pairwise(done) if j == i + 1 and records[i][2] == "training"]
    median = statistics.median(steps) if steps else None
    first = next((at for at, line in finished.lines if launches.ITERATION.search(line)), None)
    row = {"returncode": finished.returncode, "wall_s": finished.wall_s, "first_step_s": first, "faults": faults}
    row["after_first_step_s"] = None if first is None else round(finished.wall_s - first, 2)
    row["median_step_s"] = None if median is None else round(median, 3)
    row |= {"product": (read_json(run_dir / "goodput.json") or {}).get("total", {}), "left": finished.left_behind}
    row["timeline"] = goodput(records, done, started + finished.wall_s) if done else {}
    return row | {"saves": save_costs(records, done, median) if median else []}


def checks(arm: str, row: dict) -> list[list]:
    """Issue 67's targets, [what, figure, bounds, met]: the goodput line's clock (both arms), then arm B's."""
    product, wall, after = row["product"], row["wall_s"], row["after_first_step_s"]
    pairs = [(product.get(key), ours) for key, ours in (("wall_s", wall), ("after_first_step_s", after))]
    offs = [abs(theirs - ours) / wall for theirs, ours in pairs if theirs is not None and ours is not None]
    off = round(max(offs), 4) if offs else None
    figures = [("goodput.json's wall and time after step 1 off the bench's", off, 0, 0.02)]
    if arm == "B":
        times = [f["to_next_step_s"] for f in row["faults"] if f["to_next_step_s"] is not None]
        extra = [s["extra_s"] for s in row["saves"] if s["extra_s"] is not None]
        newest = [f["from_step"] == f["newest_save"] for f in row["faults"] if f["from_step"] is not None]
        saves = round(sum(extra) / after, 4) if after else None
        figures += [
            ("median seconds from a fault to the next step", statistics.median(times) if times else None, 0, 5),
            ("share of faults that went on from the newest save", sum(newest) / len(newest) if newest else None, 1, 1),
            ("saves' extra seconds over the time after step 1", saves, -1, 0.02),
            ("goodput after step 1 (goodput.json)", product.get("goodput"), 0.95, 1),
        ]
    return [
        [what, value, f"{low}-{high}", None if value is None else low <= value <= high]
        for what, value, low, high in figures
    ]


def spread(values: list) -> str:
    got = [v for v in values if v is not None]
    return launches.spread(got) if got else "-"


def markdown(result: dict) -> str:
    arms, faults = result["arms"], ("after_step", "to_next_step_s", "trained_again", "from_step", "newest_save")
    lines = [f"# Goodput under faults, {result['date']}", "", f"{result['hardware']}; {result['versions']}."]
    lines.append(
        f"{result['faults']} faults an arm at {result['fractions']} of the room after step 1, seed {result['seed']},"
    )
    lines.append(f"{result['gap_s']} s apart or more; arm B's SRUNSH_MTBF_S={result['mtbf_s']:.0f}.")
    header = ("arm", "exit", "wall s", "first step s", "goodput (goodput.json, timeline)", "median step s")
    lines += ["", *report.table((*header, "to next step s", "trained again", "save extra s", "checkpoints, free GB"))]
    for arm, row in arms.items():
        cells = [arm, row["returncode"], row["wall_s"], row["first_step_s"]]
        cells += [f"{row['product'].get('goodput')}, {row['timeline'].get('goodput')}", row["median_step_s"]]
        cells += [spread([f[key] for f in row["faults"]]) for key in ("to_next_step_s", "trained_again")]
        disk = f"{row['checkpoint_gb']}, {row['disk_free_gb']}"
        lines.append(report.row([*cells, spread([s["extra_s"] for s in row["saves"]]), disk]))
    for keys, part in ((faults, "faults"), (("step", "held_s", "steps_after", "extra_s"), "saves")):
        rows = [[arm, *map(record.get, keys)] for arm, row in arms.items() for record in row[part]]
        lines += ["", *report.table(("arm", *keys), rows)]
    checked = [[arm, *check] for arm, row in arms.items() for check in row["checks"]]
    lines += ["", *report.table(("arm", "issue 67's target", "figure", "bounds", "met"), checked), ""]
    return "\n".join([*lines, *(f"- {arm}: `{' '.join(c)}`" for arm, c in result["commands"].items())]) + "\n"


def run_arm(arm: str, directory: Path, args: argparse.Namespace, limit_s: float, mtbf_s: float) -> dict:
    """One arm; then its checkpoints go (the device has a 64 GiB disk, this model's checkpoint about 27 GB)."""
    env, local = {"SRUNSH_GPUS_PER_NODE": "1", "SRUNSH_RUN_ID": f"goodput-{arm}"}, args.local_dir / directory.name
    local.mkdir(parents=True, exist_ok=True)
    free_gb = round(shutil.disk_usage(local).free / 1e9, 1)
    if arm == "B":
        env |= {"SRUNSH_LOCAL_CKPT_DIR": str(local), "SRUNSH_MTBF_S": f"{mtbf_s:.0f}"}
    run_dir = directory / "outputs" / Path(RECIPE).stem / env["SRUNSH_RUN_ID"]
    faults, started = Faults(run_dir, args.fractions, time.time() + limit_s, args.gap_s), time.time()
    command = launches.ours(RECIPE, *overrides(arm, args.save_every))
    row = analyse(run_dir, launches.run(command, directory, limit_s, env, faults.poll), started, faults.sent)
    kept = [path for folder in (run_dir / "checkpoints", local) for path in folder.rglob("*") if path.is_file()]
    row |= {"checkpoint_gb": round(sum(path.stat().st_size for path in kept) / 1e9, 1), "disk_free_gb": free_gb}
    for folder in (run_dir / "checkpoints", local):
        shutil.rmtree(folder, ignore_errors=True)
    return row | {"checks": checks(arm, row)}


def main(argv: list[str] | None = None) -> None:
    parser = report.parser("bench_goodput", __doc__)
    parser.add_argument("--arm-s", type=report.positive, default=270, help="launch seconds an arm (default: 270)")
    parser.add_argument("--faults", type=report.positive, default=3, help="faults an arm (default: 3)")
    parser.add_argument("--gap-s", type=report.positive, default=30, help="least seconds between faults (default: 30)")
    parser.add_argument("--seed", type=int, default=67, help="of the faults' moments (default: 67)")
    parser.add_argument("--save-every", type=report.positive, default=25, help="arm A's save interval (default: 25)")
    parser.add_argument("--order", choices=("BA", "AB", "A", "B"), default="BA", help="the arms (default: BA)")
    parser.add_argument("--local-dir", type=Path, help="arm B's local checkpoints' node disk (default: under --out)")
    parser.add_argument("--budget-s", type=report.positive, default=570, help="the bench ends by then (default: 570)")
    args = parser.parse_args(argv)
    launches.stop_on_sigterm()
    deadline, out, rng = time.monotonic() + args.budget_s, args.out.resolve(), random.Random(args.seed)
    args.local_dir = (args.local_dir or out / "local-checkpoints").resolve()
    args.fractions = sorted(round(rng.random(), 3) for _ in range(args.faults))
    mtbf_s = (args.arm_s - START_S) / args.faults  # the seconds of training a fault, as an arm is planned
    commands = {arm: launches.ours(RECIPE, *overrides(arm, args.save_every)) for arm in args.order}
    result = {**launches.result_header("goodput", 1, commands), "arms": {}, "mtbf_s": mtbf_s}
    result |= {key: getattr(args, key) for key in ("faults", "fractions", "seed", "gap_s", "save_every")}
    print(f"bench_goodput: faults at {args.fractions} of each arm's room after step 1 (seed {args.seed})", flush=True)
    launches.fix_dataset_helpers()
    runs = out / f"goodput-runs-{time.strftime('%Y%m%d-%H%M%S')}"
    for index, arm in enumerate(args.order):
        limit_s = min(args.arm_s, (deadline - time.monotonic()) / (len(args.order) - index) - STOP_S)
        if limit_s < START_S + args.gap_s:
            print(f"bench_goodput: arm {arm} not run: {limit_s:.0f} s left of --budget-s", flush=True)
            continue
        result["arms"][arm] = run_arm(arm, runs / arm, args, limit_s, mtbf_s)
        print(report.write(out / "goodput", result, markdown), flush=True)


if __name__ == "__main__":
    main()
