"""Reading torch's flight recorder records (a plain pickle of the process groups' config and status, and their
recent entries), and the summary of one that a rank writes into its hang-report answer (launcher/hang/dumps.py), so
that the launching host reads one small answer a rank instead of its whole record. Standard library only: both sides
import it.

A summary is the record in torch's own shape with only what the hang report reads of it (launcher/hang/
collectives.py): every group's config and status, its entries not completed yet, and of the rest only those that say
a group's name and description, whether NCCL recorded start times, and which operations it ran; each group's members
as ranges ("0-4095", or "3-4091:8" for ranks 8 apart) rather than torch's list of every rank, which every member of
the group would repeat.
"""

import functools
import itertools
import json
from collections.abc import Iterable


def ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    ordered = sorted(set(ranks))
    if len(ordered) > 1 and ordered[-1] - ordered[0] == len(ordered) - 1:  # one run, as a job-wide group is
        return f"{ordered[0]}-{ordered[-1]}"
    runs = itertools.groupby(enumerate(ordered), key=lambda item: item[1] - item[0])  # consecutive: alike
    bounds = [(run[0][1], run[-1][1]) for run in (list(group) for _, group in runs)]
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in bounds)


def strided(ranks: list[int]) -> str:
    """A summary's members: '5-4093:8' for ranks of one common step (a data-parallel group of ranks 8 apart, whose
    ranges would name every member), else ranges()."""
    ordered = sorted(set(ranks))
    step = ordered[1] - ordered[0] if len(ordered) > 2 else 0
    if step > 1 and ordered == list(range(ordered[0], ordered[-1] + 1, step)):
        return f"{ordered[0]}-{ordered[-1]}:{step}"
    return ranges(ordered)


@functools.cache
def expanded(text: str) -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5] and '1-9:4' -> [1, 5, 9]; one list for each text, shared by every rank that names it
    (not to be changed)."""
    ranks: list[int] = []
    for part in filter(None, text.split(",")):
        run, _, step = part.partition(":")
        first, _, last = run.partition("-")
        ranks += range(int(first), int(last or first) + 1, int(step or 1))
    return ranks


@functools.cache
def parsed(text: str) -> list[int]:
    """torch's members text, '[0, 1, 2]'; one list for each text, shared (not to be changed)."""
    return json.loads(text)


def members(config: dict) -> list[int]:
    """A group's members from its pg_config entry: torch's "ranks", or a summary's "ranges"."""
    return parsed(config["ranks"]) if "ranks" in config else expanded(config["ranges"])


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
            groups[name]["members"] = members(config)
    return groups


def kept_entries(dump: dict) -> list[dict]:
    """The entries the report reads, in their order: those of a group with a status that it has not completed; the
    first of each group name (its description) and the last of each group id (the name of its status); the last
    with a start time of each group name (whether NCCL times starts); the last of each operation (whose records these
    are)."""
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
