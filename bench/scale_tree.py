"""The run folder (RUN_DIR) that a job of N ranks leaves for the launching host, written by the code that writes it in
a real run: the hang report's records (launcher/hang's write_json, write_limit and flight recorder files, faulthandler's
stacks, torch-shaped NCCL flight recorder records) and the health check's (bench/scale_health.py).

The job (Job, N ranks 8 a node on node0001, node0002, ...): tensor parallel within a node, data parallel across
nodes, 2,000 flight recorder entries a rank. Its faults, where faults() places them: `missing`, the one rank not in the
all-reduce every other rank waits in (it waits for an async checkpoint); `silent`, a rank that registered and never
answered the hang report; `slow_node`, a node whose pairs measure 40 GB/s against 95, or on fewer than 3 nodes (no
retests there) `slow_gpu`, a rank whose matmul is 23% below the others'. What the ranks write only when asked is staged
beside RUN_DIR, and bench/scale_host.py's stand-ins move it into place when the ranks would write it. RUN_DIR also
holds an earlier hang report's records, as a requeued batch job keeps them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pickle
import random
import time
from pathlib import Path

from launcher import run_files
from launcher.hang import dumps, progress
from launcher.hang.watch import StallClock, write_limit

PER_NODE = 8


@dataclasses.dataclass(frozen=True)
class Job:
    """Its size, where its faults are, and when the ranks were asked (time.time(), every rank's clock)."""

    ranks: int
    missing: int
    silent: int
    slow_node: int
    slow_gpu: int
    asked: float

    @property
    def nodes(self) -> int:
        return self.ranks // PER_NODE

    @functools.cached_property
    def hosts(self) -> list[str]:
        return [f"node{index + 1:04d}" for index in range(self.nodes)]

    @property
    def node_list(self) -> str:
        """SLURM_JOB_NODELIST."""
        return "node0001" if self.nodes == 1 else f"node[0001-{self.nodes:04d}]"

    @property
    def link_fault(self) -> bool:
        """A capped link needs retests, which need 3 nodes; fewer get a slow GPU."""
        return self.nodes >= 3

    def host(self, rank: int) -> str:
        return f"node{rank // PER_NODE + 1:04d}"

    @property
    def slow_host(self) -> str:
        return self.host(self.slow_node * PER_NODE) if self.link_fault else self.host(self.slow_gpu)


@dataclasses.dataclass(frozen=True)
class Tree:
    """Where a job's records lie: the run folder, and beside it what the ranks write only when asked."""

    root: Path
    run_dir = property(lambda self: self.root / "run")
    staged_answers = property(lambda self: self.root / "staged-answers")
    staged_health = property(lambda self: self.root / "staged-health")


def faults(ranks: int, seed: int) -> Job:
    """The job of `ranks` ranks with its faults where `seed` puts them; the missing and the silent rank on different
    nodes where there are two."""
    rng = random.Random(seed)
    missing = rng.randrange(ranks)
    others = [rank for rank in range(ranks) if rank // PER_NODE != missing // PER_NODE]
    silent = rng.choice(others or [rank for rank in range(ranks) if rank != missing])
    rng.randrange(ranks)  # once the first failed rank: drawn still, so that a seed places the others as it did
    slow_node, slow_gpu = rng.randrange(ranks // PER_NODE), rng.randrange(ranks)
    return Job(ranks, missing, silent, slow_node, slow_gpu, asked=time.time())


FR_ENTRIES = 2_000  # launcher/hang/dumps.py's TORCH_FR_BUFFER_SIZE
LAST_STEP = 1_200
STEP_S = 2.05
STALLED_S = 350.0  # how long the ranks have waited in the all-reduce when they are asked
JOB_ID = "4242"
STEP = f"{JOB_ID}.0"
TORCH = "/usr/local/lib/python3.12/dist-packages/torch"
MEGATRON = "/usr/local/lib/python3.12/dist-packages/megatron"
CODE = "/workspace/megatron"
STDLIB = "/usr/lib/python3.12"
EARLIER_RECORD = pickle.dumps({"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": []})
# Below every main thread: Megatron Bridge's training loop under entrypoint.py (file, function, line), innermost first.
TRAINING = [
    (f"{MEGATRON}/bridge/training/train.py", "train", 380),
    (f"{MEGATRON}/bridge/training/pretrain.py", "_pretrain", 140),
    (f"{MEGATRON}/bridge/training/pretrain.py", "pretrain", 90),
    (f"{CODE}/entrypoint.py", "train", 420),
    (f"{CODE}/entrypoint.py", "main", 470),
    (f"{CODE}/entrypoint.py", "<module>", 480),
]
WAITING = [
    (f"{TORCH}/distributed/distributed_c10d.py", "all_reduce", 2870),
    (f"{TORCH}/distributed/c10d_logger.py", "wrapper", 81),
    (f"{MEGATRON}/bridge/training/train.py", "train_step", 640),
    *TRAINING,
]
MISSING = [
    (f"{STDLIB}/threading.py", "_wait_for_tstate_lock", 1167),
    (f"{STDLIB}/threading.py", "join", 1147),
    (f"{MEGATRON}/core/dist_checkpointing/strategies/async_utils.py", "maybe_finalize_async_calls", 300),
    (f"{MEGATRON}/bridge/training/checkpointing.py", "maybe_finalize_async_save", 1500),
    *TRAINING,
]
# Where the report says the missing rank is, in its words (launcher/hang/answers.py's position()).
MISSING_AT = "_wait_for_tstate_lock (threading.py:1167) from maybe_finalize_async_calls (async_utils.py:300)"
# Two more threads of every rank: the data loader's pin-memory thread and the hang report's answering thread.
THREADS = [
    [(f"{TORCH}/utils/data/_utils/pin_memory.py", "do_one_step", 29), (f"{TORCH}/utils/data/_utils/pin_memory.py",
     "_pin_memory_loop", 59), (f"{STDLIB}/threading.py", "run", 982), (f"{STDLIB}/threading.py", "_bootstrap_inner",
     1045), (f"{STDLIB}/threading.py", "_bootstrap", 1002)],
    [(f"{CODE}/launcher/hang/dumps.py", "answer_requests", 109), (f"{STDLIB}/threading.py", "run", 982),
     (f"{STDLIB}/threading.py", "_bootstrap_inner", 1045), (f"{STDLIB}/threading.py", "_bootstrap", 1002)],
]  # fmt: skip
MAIN_THREAD = 0x00007F3A2C9E4740  # every rank's main thread's ident, as threading and faulthandler give it


# ---- the hang report's records --------------------------------------------------------------------------------
def last_step_time(job: Job) -> float:
    """When step LAST_STEP completed, on the ranks' clocks: STALLED_S and one part of a step before the request."""
    return job.asked - STALLED_S - 1.8


def why(job: Job) -> str:
    """What the hang watch says when it fires (launcher/hang/watch.py's own words), for the report's --why."""
    clock = StallClock(None, 0.0)
    clock.observe({"step": LAST_STEP - 1, "phase": "training"}, 0.0)
    clock.observe({"step": LAST_STEP, "phase": "training"}, STEP_S)
    return clock.observe({"step": LAST_STEP, "phase": "training"}, STEP_S + job.asked - last_step_time(job)) or ""


def write_progress(run_dir: Path, job: Job) -> None:
    """Rank 0's step record and the hang watch's limit, as they stood when the watch fired."""
    hang = run_dir / run_files.HANG
    hang.mkdir(parents=True, exist_ok=True)
    record = {"step": LAST_STEP, "phase": "training", "time": last_step_time(job), "longest_step_s": STEP_S}
    progress.write_json(hang / progress.PROGRESS_FILE, record)
    write_limit(hang, job.asked - 3600.0, 300.0)


def stack_text(main: list[tuple[str, str, int]]) -> bytes:
    """A rank's stacks as faulthandler.dump_traceback(all_threads=True) writes them from its main thread (CPython 3.12):
    each thread's frames, innermost first, the main thread's last."""
    threads = [(0x00007F3A10FFF6C0 + (index << 24), frames) for index, frames in enumerate(THREADS)]
    lines = []
    for ident, frames in [*threads, (MAIN_THREAD, main)]:
        lines.append(
            f"{'Current thread' if ident == MAIN_THREAD else 'Thread'} 0x{ident:016x} (most recent call first):"
        )
        lines += [*(f'  File "{file}", line {line} in {function}' for file, function, line in frames), ""]
    return "\n".join([*lines, ""]).encode()


STACKS = {False: stack_text(WAITING), True: stack_text(MISSING)}  # by whether the rank is the missing one


def groups_of(job: Job, rank: int) -> list[tuple[str, str, int, list[int]]]:
    """(name, desc, this process's id of it, members) of each NCCL process group of `rank`, named as torch names
    them: the default group "0", then in the order every rank creates them (Megatron's parallel_state), data parallel,
    tensor parallel, pipeline parallel (of one rank: pipeline parallel size 1)."""
    node, local = divmod(rank, PER_NODE)
    first = node * PER_NODE
    return [
        ("0", "default_pg", 0, list(range(job.ranks))),
        (str(1 + local), "DATA_PARALLEL_GROUP", 1, list(range(local, job.ranks, PER_NODE))),
        (str(1 + PER_NODE + node), "TENSOR_MODEL_PARALLEL_GROUP", 2, list(range(first, first + PER_NODE))),
        (str(1 + PER_NODE + job.nodes + rank), "PIPELINE_MODEL_PARALLEL_GROUP", 3, [rank]),
    ]


# Each training step's collectives, in order: (group index in groups_of, op, elements).
STEP_OPS = [(2, "nccl:_allgather_base" if i % 2 else "nccl:_reduce_scatter_base", 4 << 20) for i in range(16)]
STEP_OPS += [(1, "nccl:_reduce_scatter_base", 64 << 20), (1, "nccl:_allgather_base", 64 << 20)]
STEP_OPS += [(0, "nccl:all_reduce", 1), (0, "nccl:all_reduce", 1)]


def flight_entries(job: Job, rank: int) -> tuple[list[dict], dict[int, int]]:
    """The last FR_ENTRIES entries of `rank`'s flight recorder: steps of STEP_OPS up to the one after LAST_STEP, in
    whose last op, a job-wide all-reduce, every rank but `missing` waits; and the last sequence number it enqueued of
    each group (by index)."""
    groups = groups_of(job, rank)
    per_step = {group: sum(1 for op in STEP_OPS if op[0] == group) for group in range(len(groups))}
    steps = FR_ENTRIES // len(STEP_OPS)
    first = LAST_STEP + 2 - steps
    seq = {group: (first - 1) * count for group, count in per_step.items()}
    ops = [op for _ in range(steps) for op in STEP_OPS]
    if rank == job.missing:
        ops.pop()
    entries = []
    for index, (group, name, elements) in enumerate(ops):
        seq[group] += 1
        created = job.asked - STALLED_S - (len(ops) - 1 - index) * STEP_S / len(STEP_OPS)
        waiting = rank != job.missing and index == len(ops) - 1
        record_id = (first - 1) * len(STEP_OPS) + index
        entry = flight_entry(groups[group], record_id, seq[group], (name, elements), created=created, open_=waiting)
        entries.append(entry)
    return entries, seq


def flight_entry(group: tuple, record_id: int, seq: int, op: tuple[str, int], *, created: float, open_: bool) -> dict:
    """One entry as torch's NCCL flight recorder keeps it (TORCH_NCCL_ENABLE_TIMING=1: started and completed times);
    `open_`: started on the GPU, not completed."""
    created_ns = int(created * 1e9)
    name, desc, pg_id, _ = group
    op, elements = op
    return {
        "record_id": record_id, "pg_id": pg_id, "process_group": (name, desc), "thread_name": "pt_main_thread",
        "thread_id": "140605349940096", "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
        "profiling_name": op, "time_created_ns": created_ns, "duration_ms": None if open_ else 38.5,
        "input_sizes": [[elements]], "input_dtypes": ["BFloat16"], "output_sizes": [[elements]],
        "output_dtypes": ["BFloat16"], "state": "started" if open_ else "completed",
        "time_discovered_started_ns": created_ns + 1_000_000,
        "time_discovered_completed_ns": None if open_ else created_ns + 40_000_000, "retired": not open_,
        "timeout_ms": 600_000, "is_p2p": False,
    }  # fmt: skip


def flight_record(job: Job, rank: int) -> bytes:
    """`rank`'s flight recorder as torch's _dump_nccl_trace pickles it."""
    groups = groups_of(job, rank)
    entries, enqueued = flight_entries(job, rank)
    status = {}
    for index, (_, _, pg_id, _) in enumerate(groups):
        last = enqueued[index] or -1
        completed = last - 1 if index == 0 and rank != job.missing else last  # the all-reduce it waits in
        status[str(pg_id)] = {"last_enqueued_collective": last, "last_started_collective": last}
        status[str(pg_id)] |= {"last_completed_collective": completed}
    config = {name: {"name": name, "desc": desc, "ranks": json.dumps(members)} for name, desc, _, members in groups}
    dump = {"version": "2.10", "pg_config": config, "pg_status": status, "comm_lib_version": "2.28.9"}
    return pickle.dumps(dump | {"entries": entries})


def answer(job: Job, rank: int) -> dict:
    """What a rank's answering thread writes after its stacks and its flight recorder (launcher/hang/dumps.py)."""
    result = {"rank": rank, "time": job.asked, "distributed": True, "backend": "nccl"}
    return result | {"last_step": LAST_STEP, "last_step_time": last_step_time(job), "longest_step_s": STEP_S}


def write_hang_rank(tree: Tree, job: Job, rank: int) -> None:
    """`rank`'s registration and its empty stacks file (dumps.install), and, staged, what it writes when asked."""
    hang, staged = tree.run_dir / run_files.HANG, tree.staged_answers
    registered = {"rank": rank, "host": job.host(rank), "pid": 4000 + rank, "start_time": "8812345"}
    progress.write_json(hang / f"rank-{rank}.json", registered | {"main_thread": MAIN_THREAD})
    (hang / f"stacks-rank-{rank}.txt").touch()
    earlier = dumps.record_flight_recorder(hang / "fr" / f"rank-{rank}", EARLIER_RECORD)
    progress.write_json(hang / f"answer-rank-{rank}.json", answer(job, rank) | {"time": job.asked - 3600} | earlier)
    if rank == job.silent:
        return
    (staged / f"stacks-rank-{rank}.txt").write_bytes(STACKS[rank == job.missing])
    fields = dumps.record_flight_recorder(staged / "fr" / f"rank-{rank}", flight_record(job, rank))
    progress.write_json(staged / f"answer-rank-{rank}.json", answer(job, rank) | fields)
