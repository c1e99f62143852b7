"""The commands a launch runs and the environment every rank inherits, from its launch plan.

The launch is one srun step that runs `srun.sh --rank-exec COMMAND` in every rank, its geometry spelled out so that
nothing inherited from the allocation or an enclosing step (-n1, --ntasks-per-node=1, --cpus-per-task, cyclic
placement) changes where the ranks go; with --local, torchrun on this host.
"""

from __future__ import annotations

import os
import sys
from typing import BinaryIO

from launcher.checkpoints import plan as saves
from launcher.errors import q, say
from launcher.host.plan import LaunchPlan
from launcher.host.preflight import HEALTH_PROGRAM

# The rank environment that --dry-run shows, in this order.
SHOWN = (
    *("NCCL_DEBUG", "OMP_NUM_THREADS", "NCCL_GIN_TYPE", "DEEP_EP_BACKEND", "MASTER_ADDR", "MASTER_PORT", "RUN_ID"),
    *("RUN_DIR", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SRUNSH_NSYS", "SRUNSH_COMPILE_CACHE", "SRUNSH_KEEP_WORK"),
    *("SRUNSH_LOCAL_CKPT_DIR", "SRUNSH_MTBF_S"),
)
# What srun.sh sets for the ranks only where the launch has it (a container, --nsys), never inherited from the launching
# host; a knob among them keeps its name and meaning (SRUNSH_SQSH, SRUNSH_MOUNT, SRUNSH_NSYS), checked and resolved.
OWN = ("SRUNSH_SQSH", "SRUNSH_MOUNT", "SRUNSH_NSYS", "SRUNSH_JOB_NAME", "SRUNSH_UNDER_NSYS", "RANK", "LOCAL_RANK")


def export_rank_environment(plan: LaunchPlan) -> None:
    """What srun.sh sets for every rank (srun.sh itself exports the network's defaults); a value the user set wins
    where the user may set it."""
    for name in OWN:
        os.environ.pop(name, None)
    env = {
        "MASTER_ADDR": plan.master_addr,
        "MASTER_PORT": plan.master_port,
        "WORLD_SIZE": str(plan.world_size),
        "LOCAL_WORLD_SIZE": str(plan.ranks_per_node),
        "RUN_ID": plan.run_id,
        "RUN_DIR": plan.rank_run_dir,
        "SRUNSH_INPROCESS": str(int(plan.inprocess)),
        "SRUNSH_COMPILE_CACHE": plan.compile_cache or "off",  # where launcher/rank/rank.sh keeps kernel caches
        "SRUNSH_KEEP_WORK": str(int(plan.keep_work)),  # the ranks save by default (launcher/checkpoints)
        "SRUNSH_LOCAL_CKPT_DIR": plan.local_ckpt_dir or "off",
        "SRUNSH_MTBF_S": plan.mtbf_s,
    }
    if plan.nsys:
        env["SRUNSH_NSYS"] = plan.nsys_path  # the profiled ranks start again under it (launcher/rank/nsys.py)
    if plan.container:
        env["SRUNSH_SQSH"] = plan.image  # named in entrypoint.py's error when the image lacks the stack
        env["SRUNSH_MOUNT"] = plan.container_mounts  # the data checks see paths as the container does
    if os.environ.get("SLURM_JOB_NAME"):
        env["SRUNSH_JOB_NAME"] = os.environ["SLURM_JOB_NAME"]  # launch.json's: the step gets its own name
    if plan.ranks_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
        # torchrun's rule: ranks that share a node get one CPU thread each, a node's only rank every CPU it may use (one
        # thread cost the Llama 3 8B shape's model set-up about 2 s on one H100: bench/results/startup.md)
        env["OMP_NUM_THREADS"] = "1"
    if plan.inprocess:
        env["TORCH_CPP_LOG_LEVEL"] = os.environ.get("TORCH_CPP_LOG_LEVEL") or "error"  # NVRx's store polls warn
    os.environ.update(env)


def rank_command(plan: LaunchPlan, health: bool = False) -> list[str]:
    """What every rank runs: entrypoint.py with the recipe and the overrides, or the health check."""
    if health or plan.health_only:
        return [plan.python, f"{plan.code_dir}/{HEALTH_PROGRAM}"]
    return [plan.python, f"{plan.code_dir}/entrypoint.py", plan.recipe_arg, *plan.overrides]


def launch_command(plan: LaunchPlan, health: bool = False) -> list[str]:
    """The srun step (or torchrun) that runs rank_command in every rank, through srun.sh --rank-exec."""
    rank = [f"{plan.code_dir}/srun.sh", "--rank-exec", *rank_command(plan, health)]
    if plan.local:
        return [
            *(plan.python, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={plan.ranks_per_node}"),
            *(f"--master-addr={plan.master_addr}", f"--master-port={plan.master_port}", "--no-python", *rank),
        ]
    command = [
        *("srun", f"--nodes={len(plan.hosts)}", f"--ntasks={plan.world_size}"),
        f"--ntasks-per-node={plan.ranks_per_node}",
    ]
    if plan.cpus_per_rank:
        command.append(f"--cpus-per-task={plan.cpus_per_rank}")
    command += [
        *("--distribution=block", "--mpi=none", f"--kill-on-bad-exit={int(not plan.inprocess)}"),
        f"--job-name={plan.step_name}",
    ]
    if os.environ.get("SLURM_STEP_ID"):  # started from inside a job step (srun --pty bash): share its resources
        command.append("--overlap")
    if plan.container:
        command += [f"--container-image={plan.image}", f"--container-mounts={plan.pyxis_mounts}"]
        command.append(f"--container-workdir={plan.task_workdir}")
        if plan.container_name:
            command.append(f"--container-name={plan.container_name}")
    return [*command, *plan.srun_extra_args, *rank]


def one_line(command: list[str]) -> str:
    """A command as one copy-pasteable line."""
    return " ".join(q(word) for word in command)


def dry_run(plan: LaunchPlan) -> None:
    """What --dry-run prints: the launch's commands and the ranks' environment, on stdout."""
    lines = ["# srun.sh --dry-run: nothing was started. Each command below is one line you can paste into a shell."]
    if not plan.local and not os.environ.get("SLURM_JOB_ID"):
        lines.append("# Not inside an allocation: job id JOBID and the first node NODE1 are placeholders.")
    if plan.env_knobs:
        lines.append(f"# knobs from the environment: {plan.env_knobs}")
    if saving := saves.line(plan):
        lines.append(f"# {saving}")
    lines.append("# Environment srun.sh exports (every rank inherits it):")
    lines += [f"export {name}={q(os.environ[name])}" if name in os.environ else f"unset {name}" for name in SHOWN]
    if plan.health and not plan.health_only:
        lines.append("# Health check, run first (SRUNSH_HEALTH=1):")
        lines.append(one_line(launch_command(plan, health=True)))
    lines.append("# Launch command:")
    lines.append(one_line(launch_command(plan)))
    sys.stdout.buffer.write(os.fsencode("\n".join(lines) + "\n"))
    sys.stdout.flush()
    say_environment_knobs(plan, "", None)


def say_environment_knobs(plan: LaunchPlan, prefix: str, out: BinaryIO | None) -> None:
    """The line that names the knobs the environment set, after PREFIX, on OUT (None: said already); and, on
    stderr, the old names it did not read."""
    if plan.env_knobs and out is not None:
        out.write(os.fsencode(f"{prefix}knobs from the environment: {plan.env_knobs}\n"))
        out.flush()
    if plan.env_ignored:
        say(f"srun.sh: not read, since srun.sh's knobs have the SRUNSH_ prefix: {plan.env_ignored}")
