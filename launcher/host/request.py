"""What srun.sh hands the supervisor: its knobs (NAME=VALUE, defaults applied), its options and the words after them
(RECIPE.py and its overrides); checked (launcher/host/preflight.py) into the launch plan."""

from __future__ import annotations

import os
import sys
from typing import BinaryIO

from launcher.host.plan import LaunchPlan
from launcher.host.preflight import BadInputError, Launch, default_overrides, preflight
from launcher.shell_quote import q

Knobs = dict[str, str]
OPTIONS = ("--nsys", "--dry-run", "--no-container", "--local", "--health")


def split_argv(argv: list[str]) -> tuple[Knobs, list[str]]:
    """srun.sh's NAME=VALUE settings, then -- and its own arguments."""
    split = argv.index("--")
    knobs = dict(pair.split("=", 1) for pair in argv[:split])
    knobs.setdefault("MASTER_ADDR", "")
    knobs.setdefault("MASTER_PORT", "")
    return knobs, argv[split + 1 :]


def parse_options(words: list[str], batch_job: bool = False, submitting: bool = False) -> Launch:
    """srun.sh's options, and the words after them."""
    switches = {"nsys": False, "dry_run": False, "container": True, "local": False, "health": False}
    while words:
        word = words[0]
        if word == "--sbatch":
            raise BadInputError(
                "--sbatch comes first: ./srun.sh --sbatch [SBATCH_OPTION ...] -- [options] RECIPE.py ..."
            )
        if word.startswith("-") and word not in OPTIONS:
            raise BadInputError(
                f"unknown option {q(word)}: the options are --nsys --dry-run --no-container --local --health --sbatch"
                " --help"
            )
        if word not in OPTIONS:
            break
        if word == "--local":
            switches["local"], switches["container"] = True, False
        elif word == "--no-container":
            switches["container"] = False
        else:
            switches[word.removeprefix("--").replace("-", "_")] = True
        words = words[1:]
    return Launch(words=words, submitting=submitting, batch_job=batch_job, sbatch_args=[], **switches)


def checked_plan(args: Launch, knobs: Knobs) -> LaunchPlan:
    """The launch plan of ARGS, after every check on this host; BadInputError names the first problem."""
    checked = preflight(args, knobs)
    return LaunchPlan(
        local=args.local,
        container=args.container,
        nsys=args.nsys,
        dry_run=args.dry_run,
        health_only=args.health,
        batch_job=args.batch_job,
        health=args.health or knobs["SRUNSH_HEALTH"] == "1",
        health_timeout_s=knobs["SRUNSH_HEALTH_TIMEOUT_S"],
        hang_timeout_s=knobs["SRUNSH_HANG_TIMEOUT_S"],
        import_all=knobs["SRUNSH_IMPORT_ALL"] == "1",
        ranks_per_node=int(checked.gpus_per_node),
        cpus_per_rank=checked.cpus_per_rank,
        image=checked.image,
        container_mounts=checked.container_mounts,
        container_name=knobs["SRUNSH_CONTAINER_NAME"],
        code_dir=checked.code_dir,
        recipe_arg=checked.recipe_arg,
        run_root=checked.run_root,
        run_root_in=checked.run_root_in,
        task_workdir=checked.task_workdir,
        python=knobs["SRUNSH_PYTHON"],
        nsys_path=knobs["SRUNSH_NSYS"],
        srun_extra_args=knobs["SRUNSH_SRUN_EXTRA_ARGS"].split("\n", 1)[0].split(),
        overrides=[] if args.health else [*args.words[1:], *default_overrides(args)],
        env_knobs=checked.env_knobs,
        env_ignored=checked.env_ignored,
    )


def say_environment_knobs(plan: LaunchPlan, prefix: str, out: BinaryIO | None) -> None:
    """The line that names the knobs the environment set, after PREFIX, on OUT (None: said already); and, on
    stderr, the old names it did not read."""
    if plan.env_knobs and out is not None:
        out.write(os.fsencode(f"{prefix}knobs from the environment: {plan.env_knobs}\n"))
        out.flush()
    if plan.env_ignored:
        message = f"srun.sh: not read, since srun.sh's knobs have the SRUNSH_ prefix: {plan.env_ignored}\n"
        sys.stderr.buffer.write(os.fsencode(message))
        sys.stderr.flush()
