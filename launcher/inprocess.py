"""srun.sh's plan for in-process restart (nvidia-resiliency-ext's inprocess.Wrapper, around Megatron Bridge's
pretrain()), read from the NAME=VALUE arguments on the launching host before anything starts:

    python3 launcher/inprocess.py --nodes N --ranks-per-node G --master-port P -- [NAME=VALUE ...]
    python3 launcher/inprocess.py --outcome RUN_DIR

It prints one line, "ENABLED HEADER": ENABLED 1 or 0, and the sentence for the launch's header, which names the spare
nodes (none when off); or one line on stderr and exit 2 for a plan that cannot work.

The switch is the override inprocess_restart.enabled=true, and spare nodes come from
inprocess_restart.active_world_size: the ranks beyond it wait as warm spares. srun.sh needs to know before the step
starts, since a step it starts with --kill-on-bad-exit ends at the first failed rank, which is what in-process restart
is meant to survive.

--outcome: after a step in which a rank ended with an error, whether training completed all the same, on the ranks
that replaced it (rank 0's progress record says "ended" and RUN_DIR/restarts.log has a restart): exit 0 with one
line naming the ranks that failed, else exit 1 and srun.sh reports the failure as it does without in-process restart.

It runs with the standard library only (the launching host may have no training stack); the ranks
check the resolved config again (launcher/resilience.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

if not __package__:  # run as a script (srun.sh): the repository, not launcher/, holds the package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from launcher.first_failure import rank_ends

SECTION = "inprocess_restart."
# Megatron Bridge takes MASTER_PORT+1 for its coordination store and nvidia-resiliency-ext MASTER_PORT+2 for its own.
PORTS_TAKEN = (1, 2)
TRUE, FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0", "null", "none"}


class PlanError(ValueError):
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


def settings(assignments: list[str]) -> dict[str, str]:
    """The inprocess_restart.FIELD=VALUE arguments, by FIELD; `~inprocess_restart` drops them all."""
    found: dict[str, str] = {}
    for assignment in assignments:
        if assignment in ("~inprocess_restart", "inprocess_restart=null"):
            found.clear()
        name, _, value = assignment.partition("=")
        if name.startswith(SECTION):
            found[name.removeprefix(SECTION)] = value.strip()
    return found


def flag(field: str, value: str) -> bool:
    if value.lower() in TRUE:
        return True
    if value.lower() in FALSE:
        return False
    raise PlanError(f"{SECTION}{field}={value!r} is not true or false: write {SECTION}{field}=true")


def count(field: str, value: str) -> int | None:
    if value.lower() in ("null", "none", ""):
        return None
    if not value.isdigit() or int(value) == 0:
        raise PlanError(f"{SECTION}{field}={value!r} is not a positive rank count: e.g. {SECTION}{field}=8")
    return int(value)


def plan(assignments: list[str], nodes: int, ranks_per_node: int, master_port: int) -> Plan:
    given = settings(assignments)
    world_size = nodes * ranks_per_node
    enabled = flag("enabled", given.get("enabled", "false"))
    active = count("active_world_size", given.get("active_world_size", "null")) or world_size
    granularity = given.get("granularity", "node")
    result = Plan(enabled, world_size, active, ranks_per_node, granularity)
    if not enabled:
        return result
    if active > world_size:
        raise PlanError(
            f"{SECTION}active_world_size={active} is more than the job's {world_size} rank(s)"
            f" ({nodes} node(s) x {ranks_per_node}): allocate more nodes or lower it"
        )
    if granularity == "node" and (world_size - active) % ranks_per_node:
        raise PlanError(
            f"{SECTION}active_world_size={active} leaves {world_size - active} spare rank(s), not whole nodes of"
            f" {ranks_per_node}: spares are whole nodes, so make it {world_size} minus a multiple of {ranks_per_node}"
        )
    taken = [master_port + offset for offset in PORTS_TAKEN]
    if taken[-1] > 65535:
        raise PlanError(
            f"MASTER_PORT={master_port}: in-process restart also takes ports {taken[0]} and {taken[-1]}, past 65535:"
            " set MASTER_PORT to 65533 or less, or leave it unset"
        )
    return result


def failed_ranks(run_dir: Path) -> list[str]:
    """'RANK on HOST (exit status S)' for each rank that recorded a non-zero end (launcher/rank.sh), by rank."""
    ends = sorted(rank_ends(run_dir / "logs"), key=lambda end: int(end.rank))
    return [f"{end.rank} on {end.host} (exit status {end.status})" for end in ends]


def outcome(run_dir: Path) -> int:
    try:
        ended = json.loads((run_dir / "hang" / "progress.json").read_text()).get("phase") == "ended"
        restarted = bool((run_dir / "restarts.log").read_text().strip())
    except (OSError, ValueError):
        return 1
    if not (ended and restarted):
        return 1
    print(
        f"srun.sh: training completed after in-process restart; rank(s) {', '.join(failed_ranks(run_dir))} ended"
        f" and were replaced ({run_dir / 'restarts.log'})",
        file=sys.stderr,
    )
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--outcome"]:
        return outcome(Path(argv[1]))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--ranks-per-node", type=int, required=True)
    parser.add_argument("--master-port", type=int, required=True)
    split = argv.index("--") if "--" in argv else len(argv)  # after it, the launch's NAME=VALUE, whatever they hold
    args = parser.parse_args(argv[:split])
    try:
        result = plan(argv[split + 1 :], args.nodes, args.ranks_per_node, args.master_port)
    except PlanError as error:
        print(f"srun.sh: {error}", file=sys.stderr)
        return 2
    print(f"{int(result.enabled)} {result.header()}".rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
