"""The launching host's plan for in-process restart, and its outcome (docs/failures.md). Standard library only."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from launcher.assignments import section, split
from launcher.errors import UsageError, say
from launcher.run_files import rank_ends

NAME = "inprocess_restart"
SECTION = f"{NAME}."  # of each field's NAME=VALUE
# Megatron Bridge takes MASTER_PORT+1 for its coordination store and nvidia-resiliency-ext MASTER_PORT+2 for its own.
PORTS_TAKEN = (1, 2)
TRUE, FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0", "null", "none"}


class PlanError(UsageError):
    """A plan that cannot work: its message names the problem and the fix."""


@dataclasses.dataclass(frozen=True)
class Plan:
    enabled: bool
    world_size: int
    active_world_size: int
    ranks_per_node: int
    granularity: str = "node"

    @property
    def spare_nodes(self) -> int:
        return (self.world_size - self.active_world_size) // self.ranks_per_node

    def header(self) -> str:
        """The launch header's sentence naming the warm spares (the ranks beyond active_world_size); "" when off."""
        if not self.enabled:
            return ""
        spare_ranks = self.world_size - self.active_world_size
        if self.granularity == "node" and spare_ranks:
            spares = f"{self.spare_nodes} spare node(s) of {self.ranks_per_node} rank(s)"
        else:
            spares = f"{spare_ranks} spare rank(s)" if spare_ranks else "no spare"
        return (
            f"in-process restart on: {self.active_world_size} of {self.world_size} rank(s) train, {spares};"
            " a failed rank restarts training in every process, and the step ends only when nvidia-resiliency-ext"
            " gives up"
        )


def flag(field: str, value: str) -> bool:
    if value.lower() not in TRUE | FALSE:
        raise PlanError(f"{SECTION}{field}={value!r} is not true or false: write {SECTION}{field}=true")
    return value.lower() in TRUE


def count(field: str, value: str) -> int | None:
    if value.lower() in ("null", "none", ""):
        return None
    if not value.isdigit() or int(value) == 0:
        raise PlanError(f"{SECTION}{field}={value!r} is not a positive rank count: e.g. {SECTION}{field}=8")
    return int(value)


def plan(assignments: list[str], nodes: int, ranks_per_node: int, master_port: int) -> Plan:
    """The plan of a launch of NODES x RANKS_PER_NODE ranks; PlanError for one that cannot work."""
    given = section(split(assignments), NAME)  # `~inprocess_restart` drops them all
    world_size = nodes * ranks_per_node
    enabled = flag("enabled", given.get("enabled", "false"))
    active = count("active_world_size", given.get("active_world_size", "null")) or world_size
    result = Plan(enabled, world_size, active, ranks_per_node, given.get("granularity", "node"))
    if enabled:
        check(result, nodes, master_port)
    return result


def check(result: Plan, nodes: int, master_port: int) -> None:
    active, world_size, per_node = result.active_world_size, result.world_size, result.ranks_per_node
    if active > world_size:
        raise PlanError(
            f"{SECTION}active_world_size={active} is more than the job's {world_size} rank(s)"
            f" ({nodes} node(s) x {per_node}): allocate more nodes or lower it"
        )
    if result.granularity == "node" and (world_size - active) % per_node:
        raise PlanError(
            f"{SECTION}active_world_size={active} leaves {world_size - active} spare rank(s), not whole nodes of"
            f" {per_node}: spares are whole nodes, so make it {world_size} minus a multiple of {per_node}"
        )
    taken = [master_port + offset for offset in PORTS_TAKEN]
    if taken[-1] > 65535:
        raise PlanError(
            f"MASTER_PORT={master_port}: in-process restart also takes ports {taken[0]} and {taken[-1]}, past 65535:"
            " set MASTER_PORT to 65533 or less, or leave it unset"
        )


def outcome(run_dir: Path) -> int:
    """0, after one line on stderr naming the replaced ranks, when training completed after a restart; else 1."""
    try:
        ended = json.loads((run_dir / "hang" / "progress.json").read_text()).get("phase") == "ended"
        restarted = bool((run_dir / "restarts.log").read_text().strip())
    except (OSError, ValueError):
        return 1
    if not (ended and restarted):
        return 1
    ends = sorted(rank_ends(run_dir / "logs"), key=lambda end: int(end.rank))  # those that failed (rank-R.status)
    failed = ", ".join(f"{end.rank} on {end.host} (exit status {end.status})" for end in ends)
    say(
        f"srun.sh: training completed after in-process restart; rank(s) {failed} ended and were replaced"
        f" ({run_dir / 'restarts.log'})"
    )
    return 0
