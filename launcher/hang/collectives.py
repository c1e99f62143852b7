"""What torch's flight recorder records say of collectives not completed; standard library only (docs/health.md)."""

import dataclasses
import functools
import importlib.util
import itertools
import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from launcher.hang.answers import Rank


def ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    ordered = sorted(set(ranks))
    if len(ordered) > 1 and ordered[-1] - ordered[0] == len(ordered) - 1:  # one run, as a job-wide group is
        return f"{ordered[0]}-{ordered[-1]}"
    runs = itertools.groupby(enumerate(ordered), key=lambda item: item[1] - item[0])  # consecutive: alike
    bounds = [(run[0][1], run[-1][1]) for run in (list(group) for _, group in runs)]
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in bounds)


def strided(ranks: list[int]) -> str:
    """'5-4093:8' for ranks of one common step (a data-parallel group of ranks 8 apart), else ranges()."""
    ordered = sorted(set(ranks))
    step = ordered[1] - ordered[0] if len(ordered) > 2 else 0
    if step > 1 and ordered == list(range(ordered[0], ordered[-1] + 1, step)):
        return f"{ordered[0]}-{ordered[-1]}:{step}"
    return ranges(ordered)


# One list for each members text, shared by every rank's record that names it (so not to be changed).
@functools.cache
def expanded(text: str) -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5] and '1-9:4' -> [1, 5, 9]."""
    ranks: list[int] = []
    for part in filter(None, text.split(",")):
        run, _, step = part.partition(":")
        first, _, last = run.partition("-")
        ranks += range(int(first), int(last or first) + 1, int(step or 1))
    return ranks


parsed = functools.cache(json.loads)  # torch's members text, '[0, 1, 2]'


def members(config: dict) -> list[int]:
    """A group's members from its pg_config entry: torch's "ranks", or a summary's "ranges"."""
    return parsed(config["ranks"]) if "ranks" in config else expanded(config["ranges"])


def group_records(dump: dict) -> dict[str, dict]:
    """One rank's flight recorder -> {process group name: desc, members, enqueued, completed, entries by seq}."""
    groups: dict[str, dict] = {}
    names: dict[str, tuple[str, str]] = {}  # torch keys pg_status by the group's id, pg_config by its name

    def group(name: str, desc: str) -> dict:
        return groups.setdefault(name, {"desc": desc, "members": None, "enqueued": 0, "completed": 0, "entries": {}})

    for entry in dump.get("entries", []):
        if entry.get("is_p2p"):  # it shares the sequence number of the collective before it
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
            groups[name]["members"] = members(config)
    return groups


def kept_entries(dump: dict) -> list[dict]:
    """The entries a summary keeps, in order (docs/health.md, "In the code")."""
    entries = dump.get("entries", [])
    completed = {name: group["completed"] for name, group in group_records(dump).items()}
    statuses = {str(pg_id) for pg_id in dump.get("pg_status", {})}
    keep: set[int] = set()
    first: dict[str, int] = {}
    last: dict[tuple[str, object], int] = {}
    for index, entry in enumerate(entries):
        last["op", entry.get("profiling_name")] = index
        if entry.get("is_p2p"):
            continue
        pg_id, name = str(entry["pg_id"]), str(entry["process_group"][0])
        first.setdefault(name, index)
        last["id", pg_id] = index
        if entry.get("time_discovered_started_ns"):
            last["timed", name] = index
        if pg_id in statuses and int(entry["collective_seq_id"]) > completed[name]:
            keep.add(index)
    return [entries[index] for index in sorted(keep | set(first.values()) | set(last.values()))]


def summary(dump: dict) -> dict:
    """DUMP with only what the hang report reads of it (the module's text), for JSON."""
    config = {
        name: {**{k: v for k, v in group.items() if k != "ranks"}, "ranges": strided(members(group))}
        for name, group in dump.get("pg_config", {}).items()
    }
    return {"version": dump.get("version"), "pg_config": config, "pg_status": dump.get("pg_status", {}),
            "entries": kept_entries(dump)}  # fmt: skip


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
    entered_s: float | None  # how long before its answer the first waiting rank entered it, where known

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
    """Each group's oldest collective not all members completed; with members outside it first, then most waited in."""
    records = {number: group_records(rank.dump) for number, rank in ranks.items() if rank.dump is not None}
    holders: dict[str, dict[int, dict]] = {}  # each group's records, by the rank they are of
    for number, groups in records.items():
        for name, group in groups.items():
            holders.setdefault(name, {})[number] = group
    found = [c for name in sorted(holders) if (c := oldest_open(name, holders[name], set(records), ranks, world))]
    return sorted(found, key=lambda c: (not c.outside(), -len(c.waiting()), -len(c.members), c.seq))


def oldest_open(
    name: str, holders: dict[int, dict], recorded: set[int], ranks: dict[int, Rank], world: int
) -> Collective | None:
    """Group `name`'s oldest collective not every member completed, or None."""
    known = list(holders.values())
    desc = next((group["desc"] for group in known if group["desc"]), "")
    members = next((group["members"] for group in known if group["members"]), None)
    if members is None:
        members = list(range(world)) if desc == "default_pg" else list(holders)
    none = {"enqueued": 0, "completed": 0}  # a member with records, none of this group's (not created there yet)
    groups = {member: holders.get(member, none) for member in members if member in recorded}
    status = {member: (group["enqueued"], group["completed"]) for member, group in groups.items()}
    if not any(enqueued > completed for enqueued, completed in status.values()):
        return None
    seq = min(completed for _, completed in status.values()) + 1
    waiting = [member for member, (enqueued, completed) in sorted(status.items()) if enqueued >= seq > completed]
    entries = {member: holders[member]["entries"].get(seq) or {} for member in waiting}
    ops: dict[str, list[int]] = {}
    for member, entry in entries.items():
        ops.setdefault(entry.get("profiling_name", "a collective"), []).append(member)
    states = {member: str(entry.get("state")) for member, entry in entries.items()}
    # "scheduled" everywhere says that no GPU started it only where TORCH_NCCL_ENABLE_TIMING records starts at all
    timed = any(entry.get("time_discovered_started_ns") for group in known for entry in group["entries"].values())
    seen = set(states.values())
    asked = {member: (ranks[member].answer or {}).get("time") for member in waiting}  # on the rank's own clock
    entered = [asked[m] - entry["time_created_ns"] / 1e9 for m, entry in entries.items()
               if asked[m] is not None and entry.get("time_created_ns") is not None]  # fmt: skip
    return Collective(
        name, desc, sorted(members), seq, ops,
        sizes=next(filter(None, (str(entry.get("input_sizes", "")) for entry in entries.values())), ""),
        behind=sorted(member for member, (enqueued, _) in status.items() if enqueued < seq),
        silent=sorted(member for member in members if member not in recorded),
        unstarted=[m for m, state in states.items() if state == "scheduled"] if "started" in seen else [],
        gpu_states="started" if seen == {"started"} else "scheduled" if seen == {"scheduled"} and timed else "",
        entered_s=max(entered, default=None),
    )  # fmt: skip


def evidence(found: list[Collective], least_s: float | None) -> list[Collective]:
    """The collectives that say something (older than `least_s` before it was asked); None: every one."""
    return found if least_s is None else [c for c in found if c.entered_s is None or c.entered_s >= least_s]


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
