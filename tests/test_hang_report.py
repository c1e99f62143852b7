"""The pieces of srun.sh's hang report that its SLURM tests (tests/test_srun_hang.py) reach only in part: when the watch
fires, how a real faulthandler dump and NCCL-style flight recorder records are read, and Megatron Bridge's callbacks
driving the step record.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from megatron.bridge.training.callbacks import CallbackContext, CallbackManager

from launcher import hang_report, progress
from launcher.hang_report import Rank
from launcher.hang_watch import FLOOR_S, START_LIMIT_S, StallClock


def step(number: int, phase: str = "training") -> dict:
    return {"step": number, "phase": phase, "time": 0.0}


def test_fixed_timeout_fires_after_the_last_step_and_says_so():
    clock = StallClock(30.0, now=0.0)
    assert clock.observe(step(1), 100.0) is None
    assert clock.observe(step(1), 129.0) is None

    assert (
        clock.observe(step(1), 131.0) == "no training step completed for 31 s after step 1 (SRUNSH_HANG_TIMEOUT_S=30)"
    )


def test_start_gets_its_own_limit_unless_the_timeout_is_longer():
    assert StallClock(30.0, now=0.0).observe(None, START_LIMIT_S - 1) is None
    assert (
        StallClock(30.0, now=0.0)
        .observe(None, START_LIMIT_S + 1)
        .startswith(f"no training step completed in the {START_LIMIT_S + 1:.0f} s since the launch")
    )
    assert StallClock(2 * START_LIMIT_S, now=0.0).observe(None, START_LIMIT_S + 1) is None


def test_default_timeout_is_ten_times_the_longest_step_with_a_floor():
    clock = StallClock(None, now=0.0)
    for number, at in enumerate([10.0, 12.0, 14.0, 74.0], start=1):  # steps of 2 s, then one of 60 s
        assert clock.observe(step(number), at) is None
    assert clock.limit() == 600.0
    assert clock.observe(step(4), 74.0 + 599) is None
    assert "10 x the longest time between steps so far (60 s)" in clock.observe(step(4), 74.0 + 601)
    fast = StallClock(None, now=0.0)
    fast.observe(step(1), 1.0)
    fast.observe(step(2), 2.0)
    assert fast.limit() == FLOOR_S


@pytest.mark.parametrize("phase", ["saving", "ended"])
def test_checkpoint_save_and_the_end_of_training_are_no_hang(phase: str):
    clock = StallClock(5.0, now=0.0)
    clock.observe(step(1), 1.0)

    assert clock.observe(step(2, phase), 2.0) is None
    assert clock.observe(step(2, phase), 1000.0) is None


def test_real_faulthandler_dump_gives_each_threads_frames(tmp_path: Path):
    program = textwrap.dedent(
        """
        import faulthandler, threading, time
        def waiting_forever(): time.sleep(60)
        threading.Thread(target=waiting_forever, daemon=True).start()
        def main_work():
            time.sleep(0.2)
            faulthandler.dump_traceback(all_threads=True)
            print(threading.main_thread().ident)
        main_work()
        """
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)

    main = int(result.stdout.strip())
    frames = hang_report.main_thread_frames(result.stderr, main)
    assert [frame.split(" (")[0] for frame in frames] == ["main_work", "<module>"]
    other = [stack for ident, stack in hang_report.thread_stacks(result.stderr).items() if ident != main]
    assert other and other[0][0].startswith("waiting_forever (<string>:")
    assert hang_report.position(frames) == "main_work (<string>:7)"


def entry(group: str, seq: int, state: str = "scheduled", op: str = "nccl:all_reduce", pg_id: int = 0) -> dict:
    desc = "default_pg" if group == "0" else "undefined"
    started = 1 if state == "started" else None
    record = {"pg_id": pg_id, "process_group": (group, desc), "collective_seq_id": seq, "profiling_name": op}
    return record | {"state": state, "input_sizes": [[1024]], "is_p2p": False, "time_discovered_started_ns": started}


def dump(entries: list[dict], status: dict[str, tuple[int, int]], ranks: str = "[0, 1, 2, 3]") -> dict:
    return {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}},
        "pg_status": {
            pg: {"last_enqueued_collective": e, "last_completed_collective": c} for pg, (e, c) in status.items()
        },
        "entries": entries,
    }


def ranks_with(dumps: dict[int, dict]) -> dict[int, Rank]:
    return {
        n: Rank(n, f"node{n // 2 + 1}", registered={"pid": 100 + n}, dump=d, frames=["x (y.py:1)"])
        for n, d in dumps.items()
    }


def test_rank_that_never_enqueued_the_collective_is_not_in_it():
    ahead = dump([entry("0", 6, "started")], {"0": (6, 5)})
    behind = dump([entry("0", 5, "completed")], {"0": (5, 5)})
    ranks = ranks_with({0: ahead, 1: ahead, 2: ahead, 3: behind})

    (found,) = hang_report.collectives(ranks, 4)

    assert (found.seq, found.waiting(), found.outside()) == (6, [0, 1, 2], [3])
    assert found.name() == "nccl:all_reduce #6 of process group 0 (default_pg, ranks 0-3)"
    first, second, _ = hang_report.summary(ranks, [found], "srun.sh got SIGTERM", Path("/r/hang-report.txt"))
    assert first.endswith(
        "ranks 0-2 wait in nccl:all_reduce #6 of process group 0 (default_pg, ranks 0-3); 1 rank(s) not in it"
    )
    assert second == "srun.sh:   not in it: rank 3 on node2 (pid 103): at x (y.py:1)"


def test_rank_whose_gpu_never_started_the_collective_is_named_when_the_others_did():
    """A GPU stuck in earlier work: its rank enqueued the collective, but NCCL never started it there."""
    started = dump([entry("0", 9, "started")], {"0": (9, 8)}, ranks="[0, 1]")
    queued = dump([entry("0", 8, "completed"), entry("0", 9, "scheduled")], {"0": (9, 8)}, ranks="[0, 1]")
    ranks = ranks_with({0: started, 1: queued})

    (found,) = hang_report.collectives(ranks, 2)

    assert found.unstarted == [1] and found.outside() == [1]
    assert "its GPU never started it" in hang_report.whereabouts(ranks[1], [found])


def test_every_member_in_it_on_its_gpu_points_at_the_network():
    started = dump([entry("0", 9, "started")], {"0": (9, 8)}, ranks="[0, 1]")
    ranks = ranks_with({0: started, 1: started})

    found = hang_report.collectives(ranks, 2)
    first, second, _ = hang_report.summary(ranks, found, "why", Path("/r"))

    assert "every member of nccl:all_reduce #9" in first and "suspect the network between node1" in second


def test_no_incomplete_collective_is_no_finding():
    done = dump([entry("0", 4, "completed")], {"0": (4, 4)})

    assert hang_report.collectives(ranks_with({0: done, 1: done}), 2) == []


def test_ranges_of_ranks():
    assert hang_report.ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert hang_report.ranks_phrase([3], "wait") == "rank 3 waits" and hang_report.ranks_phrase([0, 1]) == "ranks 0-1"


def context(index: int, save: str | None = None, interval: int | None = None) -> CallbackContext:
    checkpoint = SimpleNamespace(save=save, save_interval=interval, non_persistent_save_interval=None)
    state = SimpleNamespace(train_state=SimpleNamespace(step=index), cfg=SimpleNamespace(checkpoint=checkpoint))
    return CallbackContext(state=state, model=[])


def test_megatron_bridges_callbacks_drive_rank_0s_step_record(tmp_path: Path):
    """Registered through Megatron Bridge's own CallbackManager, which refuses an event name it does not know."""
    callbacks = CallbackManager()
    progress.register(callbacks, tmp_path, rank=0)
    record = tmp_path / "hang" / "progress.json"

    callbacks.fire("on_train_step_end", context(3, save="/ckpt", interval=5))
    assert json.loads(record.read_text())["step"] == 4 and json.loads(record.read_text())["phase"] == "training"
    callbacks.fire("on_train_step_end", context(4, save="/ckpt", interval=5))
    assert json.loads(record.read_text())["phase"] == "saving"  # step 5 is followed by a save
    callbacks.fire("on_checkpoint_save", context(5))
    assert json.loads(record.read_text())["phase"] == "training"
    callbacks.fire("on_train_end", context(5))
    assert json.loads(record.read_text())["phase"] == "ended"
    assert progress.LAST_STEP == 5


def test_other_ranks_keep_their_step_in_memory_only(tmp_path: Path):
    callbacks = CallbackManager()
    progress.register(callbacks, tmp_path, rank=3)
    callbacks.fire("on_train_step_end", context(6))

    assert progress.LAST_STEP == 7 and not (tmp_path / "hang").exists()


def test_rank_stuck_tearing_down_after_an_error_is_not_a_hang_at_start():
    """Seen on the H200 (bench/results/per-step-ab.md): TE CUDA graphs under Megatron FSDP raised at capture after
    step 3, Megatron Bridge's failure clean-up aborted the process groups and never returned; by then the rank's
    torch.distributed was no longer initialized, which the report took for a rank that never joined."""
    frames = [
        "_abort_process_group (/site/torch/distributed/distributed_c10d.py:2101)",
        "_maybe_destroy_process_group (/site/megatron/bridge/training/pretrain.py:282)",
        "_cleanup_after_pretrain_failure (/site/megatron/bridge/training/pretrain.py:260)",
    ]
    stuck = Rank(0, "node1", registered={"pid": 100}, answer={"distributed": False, "last_step": 3}, frames=frames)
    ranks = {0: stuck}

    first, second, _ = hang_report.summary(ranks, [], "no step for 300 s", Path("/r/hang-report.txt"))

    assert hang_report.start_hang(ranks) is None
    assert "rank 0 hangs in torch.distributed's teardown after step 3" in first
    assert "its log has the error that ended training" in first
    assert (
        second == "srun.sh:   rank 0 on node1 (pid 100): at _abort_process_group (distributed_c10d.py:2101) from "
        "_maybe_destroy_process_group (pretrain.py:282)"
    )
