"""How pyxis starts this launch's container steps, and the container they share (docs/containers.md)."""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import subprocess
import time
from pathlib import Path

from launcher.errors import say
from launcher.host.plan import LaunchPlan
from launcher.host.slurm import config

# What the unpack cost and what squashfuse saves, from bench/results/container-start.md (its image, on its nodes).
MEASURED = (
    "bench/results/container-start.md: a 6.3 GB image of 80,463 files took 38-173 s a node to unpack at each step,"
    " 0.6 s to start from squashfuse"
)


@dataclasses.dataclass
class Pyxis:
    """pyxis's plugstack line (in the file `scontrol show config` names); `file`: None if unreadable."""

    file: str | None
    found: bool = False
    options: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def squashfuse(self) -> bool:
        return self.options.get("use_squashfuse", "") in ("1", "true", "yes", "y")  # pyxis's parse_bool's true


def plugstack_lines(path: Path, depth: int = 0) -> list[list[str]]:
    """Words of PATH's plugin lines and of its `include`d files (globs, as SLURM reads them); OSError if unreadable."""
    lines = []
    for line in path.read_text().splitlines():
        words = line.partition("#")[0].split()
        if words[:1] == ["include"] and len(words) > 1 and depth < 8:
            for included in sorted(glob.glob(os.path.join(path.parent, words[1]))):
                lines += plugstack_lines(Path(included), depth + 1)
        elif words:
            lines.append(words)
    return lines


def read_pyxis(file: str | None) -> Pyxis:
    try:
        lines = [] if file is None else plugstack_lines(Path(file))
    except OSError:
        file, lines = None, []
    for words in lines:
        if words[0] in ("required", "optional") and words[1:] and Path(words[1]).name == "spank_pyxis.so":
            return Pyxis(file, found=True, options=dict(word.partition("=")[::2] for word in words[2:]))
    return Pyxis(file)


def launch_container_name(run_id: str, image: Path, launch: str) -> str:
    """A name no other launch, run or image gives: run id, image file digest, `launch` (docs/containers.md)."""
    info = image.stat()
    identity = f"{info.st_dev}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns}"
    digest = hashlib.sha256(f"{identity}|{launch}".encode()).hexdigest()[:12]
    return f"srunsh-{run_id}-{digest}"


def start_note(pyxis: Pyxis, image: Path, steps: int, user_name: str, shared: str) -> str:
    """One line for the launch header: how pyxis starts this launch's steps, and for an unpack what a site can set."""
    where, sized = pyxis.file or "the plugstack configuration", f"{image} ({image.stat().st_size / 1e9:.1f} GB)"
    if user_name:
        return (
            f"container start: named container {user_name} (SRUNSH_CONTAINER_NAME): a node's first launch unpacks"
            f" {sized} into it, later ones reuse it as they find it; it stays on the nodes"
        )
    if pyxis.squashfuse:
        return f"container start: from the squash file, no unpack (use_squashfuse=1 in {where})"
    if pyxis.file is None:
        how = "pyxis's settings unread (no PlugStackConfig from scontrol, or it is unreadable here): if its default,"
    elif not pyxis.found:
        how = f"no pyxis line in {where} seen from this host: if pyxis's default,"
    else:
        how = f"pyxis's default ({where} has no use_squashfuse=1):"
    once = f" once, into {shared}, which the {steps} steps share and which is removed when the launch ends"
    unpacks = f"unpacks {sized} on every node{once if shared else ' at every step'}"
    return f"container start: {how} {unpacks}; use_squashfuse=1 in pyxis's plugstack line skips it ({MEASURED})"


def plan_start(plan: LaunchPlan) -> tuple[str, str]:
    """The container this launch's steps share (empty: none; else their --container-name), and the header's line."""
    if not plan.container:  # --local has none either
        return "", ""
    name, steps = plan.container_name, 2 if plan.health and not plan.health_only else 1
    pyxis, image, shared = read_pyxis(config("PlugStackConfig")), Path(plan.image), ""
    if steps > 1 and not name and not pyxis.squashfuse:
        launch = f"{os.environ.get('SLURM_JOB_ID', '')}.{os.environ.get('SLURM_RESTART_COUNT') or 0}.{os.getpid()}"
        shared = launch_container_name(plan.run_id, image, f"{launch}.{time.time():.6f}")
        plan.container_name = shared
    return shared, start_note(pyxis, image, steps, name, shared)


# pyxis keeps a named container as pyxis_NAME, or pyxis_JOBID_NAME with container_scope=job.
REMOVE = """for c in "pyxis_$1" "pyxis_$2_$1"; do
      if enroot list | grep -Fqx -- "$c"; then enroot remove -f -- "$c" >/dev/null && echo "removed $c"; fi
    done"""


def remove(name: str, plan: LaunchPlan, log: Path) -> None:
    """The launch's container off every node: a task a node runs enroot as pyxis does (minutes for 6 GB)."""
    nodes = str(len(plan.hosts))
    command = [
        *("srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--overlap", "--mpi=none"),
        *(f"--job-name={plan.step_name}-remove", "bash", "-c", REMOVE, "bash", name, os.environ["SLURM_JOB_ID"]),
    ]
    with open(log, "ab") as out:
        try:
            status = subprocess.run(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=600, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            status = 124
    if status:
        say(
            f"srun.sh: could not remove container {name} from every node (status {status}, see {log}):"
            f" remove it there with enroot remove -f pyxis_{name}"
        )
