"""What torch's flight recorder records say (the ranks' fr/rank-R, plain pickles): each process group's oldest
collective that not every member completed, who is in it and who is not; and torch's own analysis of them,
`torchfrtrace`, where this Python has torch and the records are NCCL's."""

import dataclasses
import importlib.util
import itertools
import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from launcher.hang.answers import Rank


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


def ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    runs = itertools.groupby(enumerate(sorted(set(ranks))), key=lambda item: item[1] - item[0])  # consecutive: alike
    bounds = [(run[0][1], run[-1][1]) for run in (list(group) for _, group in runs)]
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in bounds)


def group_records(dump: dict) -> dict[str, dict]:
    """One rank's flight recorder -> {process group name: desc, members, enqueued, completed, entries by seq}."""
    groups: dict[str, dict] = {}
    names: dict[str, tuple[str, str]] = {}

    def group(name: str, desc: str) -> dict:
        return groups.setdefault(name, {"desc": desc, "members": None, "enqueued": 0, "completed": 0, "entries": {}})

    for entry in dump.get("entries", []):
        if entry.get("is_p2p"):
            continue
        name, desc = (str(part) for part in entry["process_group"])
        desc = "" if desc == "undefined" else desc
        names[str(entry["pg_id"])] = (name, desc)
        group(name, desc)["entries"][int(entry["collective_seq_id"])] = entry
    for pg_id, status in dump.get("pg_status", {}).items():
        record = group(*names.get(str(pg_id), (str(pg_id), "")))
        record["enqueued"] = max(0, int(status["last_enqueued_collective"]))  # -1: none yet (sequence ids start at 1)
        record["completed"] = max(0, int(status["last_completed_collective"]))
    for name, config in dump.get("pg_config", {}).items():
        if name in groups:
            groups[name]["members"] = json.loads(config["ranks"])
    return groups


def collectives(ranks: dict[int, Rank], world: int) -> list[Collective]:
    """Every process group's oldest collective that not all of its members completed, the most telling first: those
    with members that are not in it, then those that the most ranks wait in."""
    records = {number: group_records(rank.dump) for number, rank in ranks.items() if rank.dump is not None}
    names = sorted({name for groups in records.values() for name in groups})
    found = [collective for name in names if (collective := oldest_open(name, records, ranks, world))]
    return sorted(found, key=lambda c: (not c.outside(), -len(c.waiting()), -len(c.members), c.seq))


def oldest_open(name: str, records: dict[int, dict], ranks: dict[int, Rank], world: int) -> Collective | None:
    """Process group `name`'s oldest collective that not every member completed, or None. `records`: each rank's
    group_records()."""
    known = [groups[name] for groups in records.values() if name in groups]
    desc = next((group["desc"] for group in known if group["desc"]), "")
    members = next((group["members"] for group in known if group["members"]), None)
    if members is None:
        members = list(range(world)) if desc == "default_pg" else [n for n in records if name in records[n]]
    none = {"enqueued": 0, "completed": 0}
    groups = {member: records[member].get(name, none) for member in members if member in records}
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
            entry = records[member][name]["entries"].get(seq) or {}
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
