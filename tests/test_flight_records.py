"""The summary of a flight recorder record that a rank writes into its hang-report answer
(launcher/hang/collectives.py): the report reads the same collectives from it as from the whole record, for any
record, and the rank's answer carries it beside torch's record."""

import dataclasses
import itertools
import json
import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.hang import collectives as hang_collectives
from launcher.hang import dumps
from launcher.hang.answers import Rank
from launcher.hang.collectives import collectives

OPS = ("nccl:all_reduce", "nccl:_allgather_base", "gloo:all_reduce", "nccl:broadcast")


@st.composite
def job_records(draw: st.DrawFn) -> tuple[int, dict[int, dict]]:
    """(world, {rank: its flight recorder}) of a job whose ranks are anywhere in the collectives of its default
    group and of up to two subgroups, with entries lost to the ring buffer, p2p entries, start times or none."""
    world = draw(st.integers(1, 6))
    groups = [("0", "default_pg", list(range(world)))]
    for index in range(draw(st.integers(0, 2))):
        members = draw(st.lists(st.integers(0, world - 1), min_size=1, max_size=world, unique=True))
        groups.append(
            (f"g{index}", draw(st.sampled_from(["undefined", "TENSOR_MODEL_PARALLEL_GROUP"])), sorted(members))
        )
    timed = draw(st.booleans())
    records = {}
    for rank in draw(st.lists(st.integers(0, world - 1), unique=True, min_size=1)):
        records[rank] = draw(rank_record(rank, groups, timed))
    return world, records


@st.composite
def rank_record(draw: st.DrawFn, rank: int, groups: list[tuple[str, str, list[int]]], timed: bool) -> dict:
    config, status, entries = {}, {}, []
    mine = [group for group in groups if rank in group[2]]
    for pg_id, (name, desc, members) in enumerate(mine):
        if draw(st.booleans()) or name == "0":
            config[name] = {"name": name, "desc": desc, "ranks": json.dumps(members)}
        enqueued = draw(st.integers(-1, 6))
        completed = draw(st.integers(-1, enqueued))
        status[str(pg_id)] = {"last_enqueued_collective": enqueued, "last_completed_collective": completed}
        for seq in range(max(1, enqueued - draw(st.integers(0, 6))), enqueued + 1):  # older ones overwritten
            state = "completed" if seq <= completed else draw(st.sampled_from(["started", "scheduled"]))
            entry = {"pg_id": pg_id, "process_group": (name, desc), "collective_seq_id": seq, "state": state}
            entry |= {"profiling_name": draw(st.sampled_from(OPS)), "input_sizes": [[draw(st.integers(1, 4))]]}
            entry |= {"is_p2p": draw(st.booleans()) and seq % 3 == 0, "time_created_ns": draw(st.integers(0, 10**12))}
            entry |= {
                "time_discovered_started_ns": draw(st.integers(1, 10**12)) if timed and draw(st.booleans()) else None
            }
            entries.append(entry)
    return {"version": "2.10", "pg_config": config, "pg_status": status, "entries": entries}


def ranks_with(records: dict[int, dict]) -> dict[int, Rank]:
    return {n: Rank(n, f"node{n}", registered={"pid": n}, answer={"time": 10.0**9}, dump=d) for n, d in records.items()}


@settings(deadline=None, max_examples=300)
@given(job_records())
def test_the_summary_gives_the_report_the_collectives_the_whole_record_gives(job: tuple[int, dict[int, dict]]):
    world, records = job
    summaries = {n: json.loads(json.dumps(hang_collectives.summary(record))) for n, record in records.items()}

    whole = [dataclasses.asdict(c) for c in collectives(ranks_with(records), world)]
    summarised = [dataclasses.asdict(c) for c in collectives(ranks_with(summaries), world)]

    assert summarised == whole
    for rank, record in records.items():  # whose records they are, as torch's analysis reads it
        assert {e["profiling_name"] for e in summaries[rank]["entries"]} == {
            e["profiling_name"] for e in record["entries"]
        }


def test_a_summary_names_members_as_ranges_and_keeps_only_what_is_not_completed_of_a_long_record():
    entries = [
        {
            "pg_id": 0,
            "process_group": ("0", "default_pg"),
            "collective_seq_id": seq,
            "profiling_name": "nccl:all_reduce",
        }
        | {"state": "completed" if seq < 2000 else "started", "time_discovered_started_ns": 5}
        for seq in range(1, 2001)
    ]
    record = {"pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(list(range(4096)))}}}
    record |= {"pg_status": {"0": {"last_enqueued_collective": 2000, "last_completed_collective": 1999}}}

    summary = hang_collectives.summary(record | {"entries": entries})

    assert summary["pg_config"] == {"0": {"name": "0", "desc": "default_pg", "ranges": "0-4095"}}
    assert [entry["collective_seq_id"] for entry in summary["entries"]] == [1, 2000]
    assert hang_collectives.group_records(summary)["0"]["members"] == list(range(4096))


def test_the_ranks_answer_carries_the_summary_beside_torchs_record(tmp_path):
    record = {"pg_status": {"0": {"last_enqueued_collective": 1, "last_completed_collective": 0}}, "entries": []}
    data = pickle.dumps(record)

    fields = dumps.record_flight_recorder(tmp_path / "rank-3", data)

    assert (tmp_path / "rank-3").read_bytes() == data
    assert fields == {"flight_recorder": "rank-3", "flight_recorder_summary": hang_collectives.summary(record)}
    assert dumps.record_flight_recorder(tmp_path / "rank-4", b"not a pickle") == {"flight_recorder": "rank-4"}


@given(
    st.sets(st.integers(0, 20_000), max_size=300)
    | st.builds(lambda a, n: set(range(a, a + n)), st.integers(0, 9), st.integers(0, 5000))
)
def test_ranges_name_every_rank_once_and_read_back_to_the_same_ranks(ranks: set[int]):
    text = hang_collectives.ranges(ranks)
    assert hang_collectives.expanded(text) == sorted(ranks)
    runs = [part.split("-") for part in filter(None, text.split(","))]
    assert all(int(run[0]) < int(run[-1]) for run in runs if len(run) == 2)
    assert all(int(a[-1]) + 1 < int(b[0]) for a, b in itertools.pairwise(runs))  # runs do not touch: each is whole


@given(
    st.sets(st.integers(0, 20_000), max_size=300)
    | st.builds(
        lambda a, n, step: set(range(a, a + n * step, step)),
        st.integers(0, 9),
        st.integers(0, 3000),
        st.integers(1, 16),
    )
)
def test_a_summarys_members_read_back_to_the_same_ranks_and_a_common_step_takes_one_run(ranks: set[int]):
    text = hang_collectives.strided(sorted(ranks))
    assert hang_collectives.expanded(text) == sorted(ranks)
    ordered = sorted(ranks)
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1, ordered[1] - ordered[0])):
        assert "," not in text
