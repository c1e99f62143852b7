"""What torch's flight recorder records say (the ranks' fr/rank-R, plain pickles): each process group's oldest
collective that not every member completed, who is in it and who is not; and torch's own analysis of them,
`torchfrtrace`, where this Python has torch and the records are NCCL's."""

import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path

from launcher.hang.answers import Rank
from launcher.hang.flight_records import group_records, ranges


@dataclasses.dataclass
class Collective:
    """One process group's oldest collective that not every member completed."""

    group: str
    desc: str
    members: list[int]
    seq: int
    ops: dict[str, list[int]]  # what the waiting ranks are in: "gloo:all_reduce" -> ranks
    sizes: str
    behind: list[int]  # members with a record that have not entered it
    silent: list[int]  # members without a record
    unstarted: list[int]  # members in it whose GPU never started it, while another member's did (NCCL)
    gpu_states: str  # "started" (every GPU is in it), "scheduled" (no GPU started it), or "" (unknown)
    entered_s: float | None = None  # how long before its answer the first waiting rank entered it, where known

    def waiting(self) -> list[int]:
        return sorted(rank for ranks in self.ops.values() for rank in ranks)

    def outside(self) -> list[int]:
        """The members the others wait for."""
        return sorted(self.behind + self.silent + self.unstarted)

    def name(self) -> str:
        # no op when every member either completed it or never entered it (a broadcast's root is done early)
        op = max(self.ops, key=lambda op: len(self.ops[op]), default="a collective")
        label = f"{self.desc}, " if self.desc else ""
        return f"{op} #{self.seq} of process group {self.group} ({label}ranks {ranges(self.members)})"


def collectives(ranks: dict[int, Rank], world: int) -> list[Collective]:
    """Every process group's oldest collective that not all of its members completed, the most telling first: those
    with members that are not in it, then those that the most ranks wait in."""
    records = {number: group_records(rank.dump) for number, rank in ranks.items() if rank.dump is not None}
    holders: dict[str, dict[int, dict]] = {}  # each group's records, by the rank they are of
    for number, groups in records.items():
        for name, group in groups.items():
            holders.setdefault(name, {})[number] = group
    found = [
        collective
        for name in sorted(holders)
        if (collective := oldest_open(name, holders[name], records, ranks, world))
    ]
    return sorted(found, key=lambda c: (not c.outside(), -len(c.waiting()), -len(c.members), c.seq))


def oldest_open(
    name: str, holders: dict[int, dict], records: dict[int, dict], ranks: dict[int, Rank], world: int
) -> Collective | None:
    """Process group `name`'s oldest collective that not every member completed, or None. `holders`: the group's
    record of each rank that has one; `records`: each rank's group_records()."""
    known = list(holders.values())
    desc = next((group["desc"] for group in known if group["desc"]), "")
    members = next((group["members"] for group in known if group["members"]), None)
    if members is None:
        members = list(range(world)) if desc == "default_pg" else list(holders)
    none = {"enqueued": 0, "completed": 0}
    groups = {member: holders.get(member, none) for member in members if member in records}
    status = {member: (group["enqueued"], group["completed"]) for member, group in groups.items()}
    if not any(enqueued > completed for enqueued, completed in status.values()):
        return None
    seq = min(completed for _, completed in status.values()) + 1
    behind = sorted(member for member, (enqueued, _) in status.items() if enqueued < seq)
    silent = sorted(member for member in members if member not in records)
    collective = Collective(name, desc, sorted(members), seq, {}, "", behind, silent, [], "")
    states: dict[int, str] = {}
    entered: list[float] = []
    for member, (enqueued, completed) in sorted(status.items()):
        if enqueued >= seq > completed:
            entry = holders[member]["entries"].get(seq) or {}
            collective.ops.setdefault(entry.get("profiling_name", "a collective"), []).append(member)
            states[member] = str(entry.get("state"))
            collective.sizes = collective.sizes or str(entry.get("input_sizes", ""))
            entered += in_flight_s(ranks[member], entry)
    if "started" in states.values():
        collective.unstarted = sorted(member for member, state in states.items() if state == "scheduled")
    collective.gpu_states = gpu_states(known, states)
    collective.entered_s = max(entered, default=None)
    return collective


def in_flight_s(rank: Rank, entry: dict) -> list[float]:
    """How long before its answer the rank had entered the collective (both on its own clock), if both are known."""
    asked, created = (rank.answer or {}).get("time"), entry.get("time_created_ns")
    return [asked - created / 1e9] if asked is not None and created is not None else []


def evidence(found: list[Collective], least_s: float | None) -> list[Collective]:
    """The collectives that say something: one its first rank entered less than `least_s` (the longest step so far;
    at a stop before a step time is known, the hang watch's limit) before it was asked is ordinary work, whatever the
    others do. None: every one."""
    if least_s is None:
        return found
    return [c for c in found if c.entered_s is None or c.entered_s >= least_s]


def gpu_states(groups: list[dict], states: dict[int, str]) -> str:
    """What NCCL's records say of the members' GPUs: all "started" the collective, none did ("scheduled", known
    only when TORCH_NCCL_ENABLE_TIMING records starts at all), or "" when that is unknown."""
    values = set(states.values())
    if values == {"started"}:
        return "started"
    timed = any(entry.get("time_discovered_started_ns") for group in groups for entry in group["entries"].values())
    return "scheduled" if values == {"scheduled"} and timed else ""


def torch_analysis(ranks: dict[int, Rank], fr_dir: Path) -> list[str]:
    """torchfrtrace's own analysis of the records, where it runs: it reads NCCL's records (not gloo's) with torch."""
    dumps = [rank.dump for rank in ranks.values() if rank.dump is not None]
    names = {entry.get("profiling_name", "") for dump in dumps for entry in dump.get("entries", [])}
    command = f"torchfrtrace {fr_dir} -p rank- --allow-incomplete-ranks"
    if not dumps:
        return ["  no flight recorder records came"]
    if not any(name.startswith("nccl:") for name in names):
        return ["  torchfrtrace reads NCCL's records only; these are gloo's (the analysis above reads them)"]
    if importlib.util.find_spec("torch") is None:
        return [f"  {sys.executable} has no torch: run `{command}` where torch is"]
    module = "torch.distributed.flight_recorder.fr_trace"
    arguments = [sys.executable, "-m", module, str(fr_dir), "-p", "rank-", "--allow-incomplete-ranks"]
    try:
        result = subprocess.run(arguments, capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        return [f"  `{command}` took more than 120 s; run it yourself"]
    output = (result.stdout + result.stderr).splitlines()[-60:]
    return [f"  `{command}` (exit status {result.returncode}):", *(f"    {line}" for line in output)]
