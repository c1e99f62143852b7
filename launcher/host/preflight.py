"""srun.sh's checks on the launching host, before anything starts: the knobs the environment set, the arguments, the
recipe, the allocation (GPUs, CPUs, a homogeneous job), the container image and mounts. The first problem found raises
UsageError, whose message names it and its fix; otherwise `preflight` gives the paths and counts the launch needs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from launcher import trackers
from launcher.assignments import assignment
from launcher.errors import UsageError, q
from launcher.host.mounts import Mount, container_path, mount_of, node_directory, split_mount
from launcher.host.plan import LaunchPlan
from launcher.host.slurm import gres_gpus_per_node

Knobs = dict[str, str]
Checks = dict[str, tuple[Callable[[str], object], str]]  # a knob's name: whether a value is taken, and why not
REPO = Path(__file__).resolve().parents[2]
HEALTH_PROGRAM = "launcher/health.py"  # the health check every rank runs, in this checkout
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
POSITIVE = re.compile(r"[1-9][0-9]*")
# srun.sh's options, and what each sets in the launch plan.
SWITCHES = {
    "--nsys": {"nsys": True},
    "--dry-run": {"dry_run": True},
    "--no-container": {"container": False},
    "--local": {"local": True, "container": False},
    "--health": {"health_only": True},
}
OPTIONS = (*SWITCHES, "-h", "--help", "--sbatch")
NAME_HINT = "use letters, digits, '.', '_' and '-'"
# The knobs' checks, in the order they are made.
KNOB_CHECKS: Checks = {
    "SRUNSH_GPUS_PER_NODE": (POSITIVE.fullmatch,
        "is not a positive integer: set it to the GPUs per node, e.g. SRUNSH_GPUS_PER_NODE=8"),
    "MASTER_PORT": (lambda value: not value or (POSITIVE.fullmatch(value) and int(value) <= 65535),
        "is not a port number: set 1-65535 or leave it unset"),
    "SRUNSH_CONTAINER_NAME": (lambda value: not value or NAME.fullmatch(value),
        f"is not a container name: {NAME_HINT}, or leave it unset for an unnamed container"),
    "SRUNSH_RUN_ID": (lambda value: not value or NAME.fullmatch(value),
        f"is not a run name: {NAME_HINT}, as in 4242-20261130-101500"),
    "SRUNSH_HEALTH": (lambda value: value in ("0", "1"),
        "is not 0 or 1: SRUNSH_HEALTH=1 runs the health check before the launch"),
    "SRUNSH_HEALTH_TIMEOUT_S": (POSITIVE.fullmatch,
        "is not a positive number of seconds: e.g. SRUNSH_HEALTH_TIMEOUT_S=60"),
    "SRUNSH_HANG_TIMEOUT_S": (lambda value: value in ("", "off") or POSITIVE.fullmatch(value),
        "is not a positive number of seconds: e.g. SRUNSH_HANG_TIMEOUT_S=900, off, or unset for the default"),
    "SRUNSH_CONSOLE_RANKS": (re.compile(r"(all|[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*)?").fullmatch,
        "is not a rank list: name ranks and ranges, e.g. SRUNSH_CONSOLE_RANKS=0,7 or 0-3, or all, or unset it"),
    "SRUNSH_COMPILE_CACHE": (lambda value: value == "off" or re.fullmatch(r"/[^\s,:]*", value),
        "is not off or an absolute path without spaces, ',' or ':' (pyxis's mount syntax): name a directory on"
        " every node's own disk, e.g. SRUNSH_COMPILE_CACHE=/var/tmp"),
    "SRUNSH_LOCAL_CKPT_DIR": (lambda value: value == "off" or re.fullmatch(r"/[^\s,:]*", value),
        "is not off or an absolute path without spaces, ',' or ':' (pyxis's mount syntax): name a directory on"
        " every node's own disk, e.g. SRUNSH_LOCAL_CKPT_DIR=/opt/dlami/nvme"),
    "SRUNSH_MTBF_S": (lambda value: not value or POSITIVE.fullmatch(value),
        "is not a positive number of seconds: the job's expected time between faults, e.g. SRUNSH_MTBF_S=86400,"
        " or unset to derive it from the node count"),
}  # fmt: skip
BATCH_KNOB_CHECKS: Checks = {
    "SRUNSH_SAVE_LEAD_S": (POSITIVE.fullmatch, "is not a number of seconds: e.g. SRUNSH_SAVE_LEAD_S=300"),
    "SRUNSH_MAX_RETRIES": (re.compile("[0-9]+").fullmatch, "is not a count: e.g. SRUNSH_MAX_RETRIES=2"),
}


def knob_names() -> list[str]:
    """The knobs, as srun.sh's Knobs section defines them."""
    section = (REPO / "srun.sh").read_text().split("# ---- Knobs", 1)[1].split("# ---- End of knobs", 1)[0]
    return re.findall(r"^([A-Z][A-Z0-9_]*)=", section, re.M)


def parse_options(words: list[str], batch_job: bool = False) -> tuple[LaunchPlan, list[str]]:
    """A launch plan with srun.sh's options set, and the words after them: RECIPE.py and its overrides."""
    plan = LaunchPlan(batch_job=batch_job)
    while words and words[0].startswith("-"):
        word, words = words[0], words[1:]
        if word == "--sbatch":
            raise UsageError("--sbatch comes first: ./srun.sh --sbatch [SBATCH_OPTION ...] -- [options] RECIPE.py ...")
        if word not in SWITCHES:
            raise UsageError(
                f"unknown option {q(word)}: the options are --nsys --dry-run --no-container --local --health --sbatch"
                " --help"
            )
        vars(plan).update(SWITCHES[word])
    return plan, words


def environment_knobs(knobs: list[str], plan: LaunchPlan) -> None:
    """The knobs the environment set, for the launch's first line (a knob inherited from the host steers every launch
    from it). A name with srun.sh's prefix that is no knob is a typo, refused; a knob's name from before it had the
    prefix is not read, and the launch says so, with the new name."""
    names = sorted(os.environ)
    for name in names:
        if name.startswith("SRUNSH_") and name not in knobs:
            raise UsageError(
                f"{name}, set in the environment, is no knob of srun.sh: unset it or fix its name (./srun.sh --help)"
            )
    plan.env_knobs = " ".join(f"{name}={q(os.environ[name])}" for name in names if name in knobs)
    plan.env_ignored = " ".join(f"{name} (now SRUNSH_{name})" for name in names if f"SRUNSH_{name}" in knobs)


def check_arguments(plan: LaunchPlan, words: list[str]) -> str:
    """The recipe (launcher/health.py for --health) after the shape of every argument is checked."""
    if plan.health_only:
        if words:
            raise UsageError(
                f"--health runs the health check alone, so {q(words[0])} has no place here:"
                " drop it, or check before a launch with SRUNSH_HEALTH=1 ./srun.sh RECIPE.py"
            )
        if plan.nsys:
            raise UsageError("--nsys profiles training, and --health trains nothing: drop one of them")
        return str(REPO / HEALTH_PROGRAM)
    if not words:
        raise UsageError("no recipe given: usage is ./srun.sh [options] RECIPE.py [NAME=VALUE ...]")
    recipe, overrides = words[0], words[1:]
    for arg in overrides:
        if arg in OPTIONS:
            raise UsageError(
                f"option {arg} comes after the recipe: put it first, as in ./srun.sh {arg} {q(recipe)} ..."
            )
        assignment(arg)  # every rank would refuse any other shape, after its imports
    return recipe


def check_knobs(checks: Checks, knob: Knobs) -> None:
    """The first knob of CHECKS whose value it does not take is refused."""
    for name, (takes, fix) in checks.items():
        if not takes(knob[name]):
            raise UsageError(f"{name}={q(knob[name])} {fix}")


def visible_gpus() -> int:
    """GPUs a process here sees, as every rank counts its own (launcher/rank/rank.sh's visible_gpus)."""
    count = ["bash", "-c", 'source "$1" && visible_gpus', "bash", str(REPO / "launcher" / "rank" / "rank.sh")]
    return int(subprocess.run(count, capture_output=True, text=True, check=True).stdout)


def local_gpus(gpus: str) -> str:
    visible = visible_gpus()
    if visible == 0 and not gpus:
        raise UsageError(
            "--local found no GPU (CUDA_VISIBLE_DEVICES, /dev/nvidia*):"
            " run it on a GPU host or set CUDA_VISIBLE_DEVICES"
        )
    gpus = gpus or str(visible)
    if POSITIVE.fullmatch(gpus) and int(gpus) > visible:
        raise UsageError(
            f"SRUNSH_GPUS_PER_NODE={gpus} but this host shows {visible} GPU(s):"
            " lower SRUNSH_GPUS_PER_NODE or widen CUDA_VISIBLE_DEVICES"
        )
    return gpus


def slurm_allocation(gpus: str, plan: LaunchPlan) -> str:
    job = os.environ.get("SLURM_JOB_ID", "")
    if not job:
        if not plan.dry_run:
            raise UsageError("not inside a SLURM allocation: run under salloc/sbatch, or use --local / --dry-run")
        return gpus or "8"
    if os.environ.get("SLURM_HET_SIZE"):
        raise UsageError(
            f"job {job} is heterogeneous ({os.environ['SLURM_HET_SIZE']} components), which srun.sh cannot place ranks"
            " in: allocate one set of identical nodes"
        )
    allocated = os.environ.get("SLURM_GPUS_PER_NODE") or os.environ.get("SLURM_GPUS_ON_NODE") or gres_gpus_per_node(job)
    allocated = allocated.split(":")[-1]  # "4" or "h100:4"
    gpus = gpus or allocated or "8"
    if not POSITIVE.fullmatch(gpus):
        return gpus  # refused by check_knobs
    if allocated and int(gpus) > int(allocated):
        raise UsageError(
            f"SRUNSH_GPUS_PER_NODE={gpus} but job {job} has {allocated} GPU(s) a node:"
            f" set SRUNSH_GPUS_PER_NODE={allocated} or allocate more (salloc --gpus-per-node={gpus})"
        )
    # The fewest CPUs a node of the job has: SLURM_JOB_CPUS_PER_NODE reads as "96(x2),48".
    counts = os.environ.get("SLURM_JOB_CPUS_PER_NODE", "").split(",")
    cpus = min((int(count.split("(", 1)[0]) for count in counts if count), default=None)
    if cpus is not None and cpus < int(gpus):
        raise UsageError(
            f"job {job} has {cpus} CPU(s) on a node for {gpus} ranks a node:"
            f" allocate whole nodes (salloc --exclusive) or at least --ntasks-per-node={gpus}"
        )
    plan.cpus_per_rank = "" if cpus is None else str(cpus // int(gpus))
    if shutil.which("srun") is None and not plan.dry_run:
        raise UsageError("srun is not found on this host: run srun.sh where SLURM's client commands are")
    return gpus


def fields(text: str, separator: str) -> list[str]:
    """TEXT's fields as bash's read splits its first line (IFS=SEPARATOR): a separator at the end ends a field."""
    line = text.split("\n", 1)[0]
    return line.removesuffix(separator).split(separator) if line else []


def parse_mounts(spec: str) -> list[Mount]:
    """SRUNSH_MOUNT's entries. pyxis takes a source that starts with neither / nor ./ for neither a path nor anything
    else, and refuses the whole step on every node, so relative sources are made absolute here."""
    mounts = []
    for entry in fields(spec, ","):
        src, dst, flags, more = split_mount(entry)
        if not src or not dst.startswith("/") or more:
            raise UsageError(
                f"SRUNSH_MOUNT entry {q(entry)} is not SRC:DST[:FLAGS] with an absolute DST:"
                f" fix SRUNSH_MOUNT, e.g. SRUNSH_MOUNT={q(f'{REPO}:/workspace/megatron')}"
            )
        mount = Mount(src, dst, flags)
        if mount.holds_paths:
            if not os.path.exists(src):
                raise UsageError(
                    f"SRUNSH_MOUNT source {q(src)} does not exist on this host: create it or drop it from SRUNSH_MOUNT"
                )
            mount.src = os.path.abspath(src)
        mounts.append(mount)
    return mounts


def in_container(mounts: list[Mount], what: str, path: str, spec: str) -> str:
    inside = container_path(mounts, path)
    if inside is None:
        raise UsageError(
            f"{what} {q(path)} is outside every SRUNSH_MOUNT source, so the ranks cannot see it:"
            f" add its directory to SRUNSH_MOUNT (now {q(spec)})"
        )
    return inside


def check_output_mount(mounts: list[Mount], run_root: str) -> None:
    """The ranks write logs, checkpoints and traces under SRUNSH_OUTPUT_ROOT: its mount must not be read-only (pyxis's
    flags are joined by '+', as in ro+rprivate)."""
    mount = mount_of(mounts, run_root)
    if mount is not None and "ro" in mount.flags.split("+"):
        raise UsageError(
            f"SRUNSH_OUTPUT_ROOT {q(run_root)} is in SRUNSH_MOUNT entry {q(f'{mount.src}:{mount.dst}:{mount.flags}')},"
            " which the ranks see read-only: drop :ro from it,"
            " or set SRUNSH_OUTPUT_ROOT to a folder of a writable mount"
        )


def check_image(image: str) -> str:
    """A squashfs file, named by its absolute path: pyxis takes a name that starts with neither / nor ./ for an image
    to pull from a registry."""
    if not os.path.isfile(image):
        raise UsageError(
            f"image SRUNSH_SQSH={q(image)} does not exist: build it with 'make build' or point SRUNSH_SQSH at one"
        )
    try:
        with open(image, "rb") as file:
            magic = file.read(4)
    except OSError:
        magic = b""
    if magic != b"hsqs":
        raise UsageError(
            f"image SRUNSH_SQSH={q(image)} is not a squashfs file:"
            " build one with 'make build' or point SRUNSH_SQSH at the .sqsh it wrote"
        )
    return os.path.abspath(image)


def container_paths(knob: Knobs, plan: LaunchPlan, recipe_abs: str) -> None:
    """The ranks run this checkout's code, not the copy baked into the image, so recipe and code always match."""
    plan.image = check_image(knob["SRUNSH_SQSH"])
    mounts = parse_mounts(knob["SRUNSH_MOUNT"])
    plan.container_mounts = ",".join(f"{m.src}:{m.dst}" + (f":{m.flags}" if m.flags else "") for m in mounts)
    spec = knob["SRUNSH_MOUNT"]
    plan.code_dir = in_container(mounts, "this checkout", str(REPO), spec)
    plan.recipe_arg = in_container(mounts, "recipe", recipe_abs, spec)
    plan.run_root_in = in_container(mounts, "SRUNSH_OUTPUT_ROOT", plan.run_root, spec)
    check_output_mount(mounts, plan.run_root)
    plan.task_workdir = container_path(mounts, os.getcwd()) or plan.code_dir


def host_paths(plan: LaunchPlan, recipe: str) -> None:
    if shutil.which(plan.python) is None:
        raise UsageError(
            f"SRUNSH_PYTHON={q(plan.python)} is not found on this host: install it or set SRUNSH_PYTHON=/path/to/python"
        )
    if plan.nsys and shutil.which(plan.nsys_path) is None:
        raise UsageError(
            f"--nsys needs nsys, but SRUNSH_NSYS={q(plan.nsys_path)} is not found:"
            " install Nsight Systems or set SRUNSH_NSYS=/path/to/nsys"
        )
    plan.code_dir, plan.recipe_arg, plan.run_root_in = str(REPO), recipe, plan.run_root


def preflight(plan: LaunchPlan, words: list[str], knob: Knobs, sbatch_args: list[str] | None = None) -> None:
    """Every check, in the order srun.sh has always made them: the first problem found is the one reported. PLAN, as
    parse_options gave it, gets the knobs and what the checks found. SBATCH_ARGS: the launch is submitted with them."""
    plan.image, plan.container_name = knob["SRUNSH_SQSH"], knob["SRUNSH_CONTAINER_NAME"]
    plan.python, plan.nsys_path = knob["SRUNSH_PYTHON"], knob["SRUNSH_NSYS"]
    plan.srun_extra_args = knob["SRUNSH_SRUN_EXTRA_ARGS"].split("\n", 1)[0].split()
    plan.health = plan.health_only or knob["SRUNSH_HEALTH"] == "1"
    plan.health_timeout_s, plan.hang_timeout_s = knob["SRUNSH_HEALTH_TIMEOUT_S"], knob["SRUNSH_HANG_TIMEOUT_S"]
    plan.console_ranks = knob["SRUNSH_CONSOLE_RANKS"]
    environment_knobs(knob_names(), plan)
    recipe = check_arguments(plan, words)
    if sbatch_args is not None:
        if plan.local:
            raise UsageError("--local runs without SLURM, so it cannot be a batch job: drop --local or --sbatch")
        check_knobs(BATCH_KNOB_CHECKS, knob)
    if not (os.path.isfile(recipe) and os.access(recipe, os.R_OK)):
        cwd = os.environ.get("PWD") or os.getcwd()
        raise UsageError(f"recipe {q(recipe)} is not a readable file: check the path (relative to {q(cwd)})")
    gpus = knob["SRUNSH_GPUS_PER_NODE"]
    if sbatch_args is not None:
        gpus = gpus or "8"  # only for the checks here: the job takes its own from its allocation
    elif plan.local:
        gpus = local_gpus(gpus)
    else:
        gpus = slurm_allocation(gpus, plan)
    check_knobs(KNOB_CHECKS, {**knob, "SRUNSH_GPUS_PER_NODE": gpus})
    plan.ranks_per_node = int(gpus)
    plan.compile_cache = node_directory(
        "SRUNSH_COMPILE_CACHE", knob["SRUNSH_COMPILE_CACHE"], "Triton's cache writes race across nodes and fail ranks"
    )
    plan.local_ckpt_dir = node_directory(
        "SRUNSH_LOCAL_CKPT_DIR",
        knob["SRUNSH_LOCAL_CKPT_DIR"],
        "every node would write a checkpoint every few steps, the load local ones spare it",
    )
    plan.mtbf_s = knob["SRUNSH_MTBF_S"]
    stem = os.path.basename(recipe).removesuffix(".py") or os.path.basename(recipe)
    plan.run_root = f"{os.path.realpath(knob['SRUNSH_OUTPUT_ROOT'])}/{stem}"
    if plan.container:
        container_paths(knob, plan, os.path.realpath(recipe))
    else:
        host_paths(plan, recipe)
        trackers.check_installed(plan.python, words[1:])
    if sbatch_args is not None:
        check_time_limit(sbatch_args, knob["SRUNSH_SAVE_LEAD_S"])
    plan.overrides = [] if plan.health_only else [*words[1:], *default_overrides(plan, words[1:])]


def default_overrides(plan: LaunchPlan, given: list[str]) -> list[str]:
    """The overrides srun.sh adds to the GIVEN ones, unless those set their names."""
    wanted = []
    if plan.nsys:  # nsys only records between cudaProfilerStart/Stop, which Megatron Bridge calls only with this on
        wanted.append("profiling.use_nsys_profiler=true")
    if plan.batch_job:
        # A batch job's ranks save a checkpoint and stop on SIGTERM: Megatron Bridge's own handler, off by default.
        # Its data loader workers get the same SIGTERM and need the handler too, or their death fails the rank
        # before it saves.
        wanted += ["train.exit_signal_handler=true", "train.exit_signal_handler_for_dataloader=true"]
    return [default for default in wanted if not any(arg.startswith(default.split("=")[0] + "=") for arg in given)]


def time_limit_seconds(limit: str) -> int | None:
    """Seconds of a SLURM time limit (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S); None for UNLIMITED or a form that sbatch
    refuses by itself."""
    found = re.fullmatch(r"(?:([0-9]+)-)?([0-9]+(?::[0-9]+){0,2})", limit)
    if not found:
        return None
    days, clock = found.groups()
    parts = [int(part) for part in clock.split(":")]
    # H[:M[:S]] after days, and H:M:S; else M[:S]
    hours, minutes, seconds = [*parts, 0, 0][:3] if days or len(parts) == 3 else [0, *parts, 0][:3]
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def check_time_limit(sbatch_args: list[str], save_lead_s: str) -> None:
    """The job's time limit, its last -t/--time as sbatch reads them (else $SBATCH_TIMELIMIT), leaves time to save."""
    limit, words = os.environ.get("SBATCH_TIMELIMIT", ""), iter(sbatch_args)
    for word in words:
        if word in ("-t", "--time"):
            limit = next(words, "")
        elif word.startswith("--time="):
            limit = word.removeprefix("--time=")
        elif word.startswith("-t") and len(word) > 2:
            limit = word[2:]
    seconds = time_limit_seconds(limit)
    if seconds is not None and seconds <= int(save_lead_s):
        raise UsageError(
            f"time limit {limit} ({seconds} s) leaves no time before the save SRUNSH_SAVE_LEAD_S={save_lead_s} s"
            " ahead of it: give a longer --time or a smaller SRUNSH_SAVE_LEAD_S"
        )
