"""The launch plan: every fact the launching host settled before anything started, kept as RUN_DIR/launch-plan.json."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from launcher.assignments import section, split
from launcher.run_files import write_private


@dataclasses.dataclass
class LaunchPlan:
    # srun.sh's options
    local: bool = False
    container: bool = True
    nsys: bool = False
    dry_run: bool = False
    health_only: bool = False
    batch_job: bool = False
    # the knobs and the checks' results
    health: bool = False  # the health check runs first
    health_timeout_s: str = "60"
    hang_timeout_s: str = ""
    console_ranks: str = ""  # SRUNSH_CONSOLE_RANKS
    ranks_per_node: int = 8
    cpus_per_rank: str = ""
    image: str = ""
    container_mounts: str = ""
    container_name: str = ""
    code_dir: str = ""  # this checkout, as the ranks see it
    recipe_arg: str = ""  # the recipe, as the ranks see it
    run_root: str = ""  # RUN_DIR's parent, as this host sees it
    run_root_in: str = ""  # as the ranks see it
    task_workdir: str = ""
    python: str = "python3"
    nsys_path: str = "nsys"
    srun_extra_args: list[str] = dataclasses.field(default_factory=list)
    overrides: list[str] = dataclasses.field(default_factory=list)
    env_knobs: str = ""  # the knobs the environment set, NAME=VALUE, for the launch's first line
    env_ignored: str = ""  # the knobs' old names the environment set, which srun.sh does not read
    # the job
    run_id: str = ""
    hosts: list[str] = dataclasses.field(default_factory=list)
    master_addr: str = ""
    master_port: str = ""
    inprocess: bool = False
    compile_cache: str = ""  # SRUNSH_COMPILE_CACHE's directory, one path on the nodes and in the container; "": off
    local_ckpt_dir: str = ""  # SRUNSH_LOCAL_CKPT_DIR's, the same way
    mtbf_s: str = ""  # SRUNSH_MTBF_S; "": from the nodes (keep_work)
    keep_work: bool = False  # a batch job or in-process restart: the ranks save by default (launcher/checkpoints)

    @property
    def world_size(self) -> int:
        return len(self.hosts) * self.ranks_per_node

    @property
    def run_dir(self) -> str:
        """RUN_DIR as this host sees it."""
        return f"{self.run_root}/{self.run_id}"

    @property
    def rank_run_dir(self) -> str:
        """RUN_DIR as the ranks see it."""
        return f"{self.run_root_in}/{self.run_id}"

    @property
    def pyxis_mounts(self) -> str:
        """pyxis's --container-mounts: SRUNSH_MOUNT's, and the node directories at their own paths."""
        mounts = [mount for mount in self.container_mounts.split(",") if mount]
        given = section(split(self.overrides), "checkpoint")  # a launch's local checkpoints are read back later
        local = self.keep_work or given.get("non_persistent_ckpt_type") == "local"
        for directory in (self.compile_cache, self.local_ckpt_dir if local else ""):
            if directory and f"{directory}:{directory}" not in mounts:
                mounts.append(f"{directory}:{directory}")
        return ",".join(mounts)

    @property
    def step_name(self) -> str:
        """The name of the launch's srun steps, by which its supervision finds them."""
        return f"srunsh-{self.run_id}"


def write(plan: LaunchPlan, path: str) -> None:
    """PATH holds PLAN, readable by the user only."""
    write_private(Path(path), json.dumps(dataclasses.asdict(plan), indent=1) + "\n")
