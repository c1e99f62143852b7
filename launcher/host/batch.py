"""Batch jobs: srun.sh --sbatch submits; the job's srun.sh --batch-job saves and requeues itself (docs/launch.md)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable

from launcher import run_files
from launcher.checkpoints import plan as saves
from launcher.errors import UsageError, say
from launcher.host import command
from launcher.host.plan import LaunchPlan
from launcher.host.preflight import REPO, Knobs, parse_options, preflight


def submission(sbatch_args: list[str], plan: LaunchPlan, lead_s: str) -> list[str]:
    submit = ["sbatch", "--requeue", "--open-mode=append", f"--signal=B:USR1@{lead_s}"]
    given = f" {' '.join(sbatch_args)} "
    if " -o" not in given and " --output" not in given:
        submit.append(f"--output={plan.run_root}/slurm-%j.out")
    return [*submit, *sbatch_args]


def refusal(out: str) -> str:
    """sbatch's reason for refusing a job: its first line naming an error, else its first line."""
    found = re.search(r"^.*(error|unrecognized|invalid).*$", out, re.I | re.M)
    return found.group(0) if found else out.split("\n", 1)[0]


def submit(words: list[str], knobs: Knobs) -> int:
    if "--" not in words:
        raise UsageError(
            "--sbatch takes sbatch options, then -- and the launch: ./srun.sh --sbatch -N 2 -t 4:00:00 -- RECIPE.py"
        )
    split = words.index("--")
    sbatch_args, launch = words[:split], words[split + 1 :]
    plan, recipe_words = parse_options(launch)
    preflight(plan, recipe_words, knobs, sbatch_args)
    sbatch = submission(sbatch_args, plan, knobs["SRUNSH_SAVE_LEAD_S"])
    head = "#!/usr/bin/env bash\n# srun.sh --sbatch: one run that saves before its time limit and requeues itself.\n"
    kept = [word for word in launch if word != "--dry-run"]  # srun.sh by its full path: sbatch copies the script away
    script = f"{head}exec {command.one_line([str(REPO / 'srun.sh'), '--batch-job', *kept])}\n"
    if plan.dry_run:
        out = sys.stdout.buffer
        out.write(b"# srun.sh --sbatch --dry-run: nothing was submitted. The submission, the job script on stdin:\n")
        command.say_environment_knobs(plan, "# ", out)
        plan.keep_work = True  # as the job's own srun.sh --batch-job plans it
        out.write(os.fsencode(f"# the job {saves.line(plan)}\n"))
        out.write(os.fsencode(command.one_line(sbatch) + "\n" + script))
        return 0
    if shutil.which("sbatch") is None:
        raise UsageError("sbatch is not found on this host: submit where SLURM's client commands are")
    test = subprocess.run([*sbatch, "--test-only"], input=script, capture_output=True, text=True, check=False)
    if test.returncode:
        raise UsageError(f"sbatch refused the job: {refusal(test.stdout + test.stderr)}")
    command.say_environment_knobs(plan, "# srun.sh: ", sys.stderr.buffer)
    with run_files.private_files():
        os.makedirs(plan.run_root, exist_ok=True)
    out = subprocess.run([*sbatch, "--parsable"], input=script, stdout=subprocess.PIPE, text=True, check=True).stdout
    job = out.strip().split(";", 1)[0]
    run = knobs["SRUNSH_RUN_ID"] or job
    print(
        f"srun.sh: submitted batch job {job}: run {run}, outputs in {plan.run_root}/{run}/, rank logs in its logs/,"
        f" the job's log in {plan.run_root}/slurm-{job}.out"
    )
    return 0


class BatchJob:
    """A batch job's knobs, its run and its time limit's USR1; made at the job's start (docs/launch.md)."""

    def __init__(self, knobs: Knobs) -> None:
        self.knobs, self.reached = knobs, False
        self.on_reach: Callable[[], None] | None = None  # the launch's, once training may start
        signal.signal(signal.SIGUSR1, self.handle)
        if not knobs["SRUNSH_RUN_ID"]:
            if not os.environ.get("SLURM_JOB_ID"):
                say("srun.sh: SLURM_JOB_ID: --batch-job runs only as the batch script of srun.sh --sbatch")
                raise SystemExit(1)
            knobs["SRUNSH_RUN_ID"] = os.environ["SLURM_JOB_ID"]

    def handle(self, _number: int, _frame: object) -> None:
        self.reached = True
        (self.on_reach or self.say_untrained)()

    def say_untrained(self) -> None:
        say(
            f"srun.sh: job {os.environ.get('SLURM_JOB_ID', '')} reaches its time limit in"
            f" {self.knobs['SRUNSH_SAVE_LEAD_S']}s before training started: it starts no training and requeues itself"
        )
