"""The pieces of srun.sh's hang report that its SLURM tests (tests/test_srun_hang.py) reach only in part: when the watch
fires, how a real faulthandler dump and NCCL-style flight recorder records are read, and Megatron Bridge's callbacks
driving the step record.
"""

import datetime
import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from megatron.bridge.training.callbacks import CallbackContext, CallbackManager

from launcher.hang import answers as hang_answers
from launcher.hang import collectives as hang_collectives
from launcher.hang import progress
from launcher.hang import report as hang_report
from launcher.hang import watch as hang_watch
from launcher.hang.answers import Rank
from launcher.hang.watch import FLOOR_S, START_LIMIT_S, StallClock


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
    frames = hang_answers.main_thread_frames(result.stderr, main)
    assert [frame.split(" (")[0] for frame in frames] == ["main_work", "<module>"]
    other = [stack for ident, stack in hang_answers.thread_stacks(result.stderr).items() if ident != main]
    assert other and other[0][0].startswith("waiting_forever (<string>:")
    assert hang_answers.position(frames) == "main_work (<string>:7)"


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

    (found,) = hang_collectives.collectives(ranks, 4)

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

    (found,) = hang_collectives.collectives(ranks, 2)

    assert found.unstarted == [1] and found.outside() == [1]
    assert "its GPU never started it" in hang_report.whereabouts(ranks[1], [found])


def test_every_member_in_it_on_its_gpu_points_at_the_network():
    started = dump([entry("0", 9, "started")], {"0": (9, 8)}, ranks="[0, 1]")
    ranks = ranks_with({0: started, 1: started})

    found = hang_collectives.collectives(ranks, 2)
    first, second, _ = hang_report.summary(ranks, found, "why", Path("/r"))

    assert "every member of nccl:all_reduce #9" in first and "suspect the network between node1" in second


def test_no_incomplete_collective_is_no_finding():
    done = dump([entry("0", 4, "completed")], {"0": (4, 4)})

    assert hang_collectives.collectives(ranks_with({0: done, 1: done}), 2) == []


def test_ranges_of_ranks():
    assert hang_collectives.ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
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
    assert progress.LAST.step == 5
    timeline = [line.split()[1:] for line in (tmp_path / "hang" / progress.TIMELINE_FILE).read_text().splitlines()]
    assert timeline == [["4", "training"], ["5", "saving"], ["5", "saved"], ["5", "ended"]]  # for the goodput line


def test_other_ranks_keep_their_step_in_memory_only(tmp_path: Path):
    callbacks = CallbackManager()
    progress.register(callbacks, tmp_path, rank=3)
    callbacks.fire("on_train_step_end", context(6))

    assert progress.LAST.step == 7 and not (tmp_path / "hang").exists()


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


# ---- A stop of a progressing job, the collectives that are evidence, the ranks that did not answer (issue 35) ------


def documented_default_limit() -> tuple[float, float, float]:
    """(factor, floor, start) of the hang watch's default limit, as README.md's knob table states it to users."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    match = re.search(r"(\d+) x the longest step so far, at least (\d+) \(before the first step: (\d+)\)", text)
    assert match, "README.md no longer states the hang watch's default limit"
    factor, floor, start = (float(group) for group in match.groups())
    return factor, floor, start


@pytest.mark.parametrize("longest_s", [1.0, 29.0, 30.0, 31.0, 95.5])
def test_default_limit_fires_just_after_what_the_readme_says_and_not_before(longest_s: float):
    factor, floor, start = documented_default_limit()
    limit = max(floor, factor * longest_s)
    assert StallClock(None, now=0.0).observe(None, start + 0.5) is not None
    clock = StallClock(None, now=0.0)
    assert clock.observe(None, start - 0.5) is None
    at = start - 1.0
    for number, gap in enumerate([longest_s / 2, longest_s, longest_s / 3], start=1):
        at += gap
        assert clock.observe(step(number), at) is None

    assert clock.observe(step(3), at + limit - 0.5) is None
    assert clock.observe(step(3), at + limit + 0.5) is not None


def answered(last_step: int, since_s: float, longest_s: float, asked: float = 1_000_000.0) -> dict:
    return {"time": asked, "last_step": last_step, "last_step_time": asked - since_s, "longest_step_s": longest_s}


def test_stop_of_a_progressing_job_blames_nobody_though_a_rank_is_not_yet_in_the_collective():
    """At a stop 0.1 s after step 7 of 0.3 s steps, rank 3 has not reached the all-reduce that ranks 0-2 entered
    0.05 s ago: an ordinary moment of training, which the report took for a rank stuck outside the collective."""
    ahead = dump([entry("0", 8, "started") | {"time_created_ns": int((1_000_000.0 - 0.05) * 1e9)}], {"0": (8, 7)})
    behind = dump([entry("0", 7, "completed")], {"0": (7, 7)})
    ranks = ranks_with({0: ahead, 1: ahead, 2: ahead, 3: behind})
    for number, rank in ranks.items():
        rank.answer = answered(7, 0.1 + 0.01 * number, 0.3)
    found = hang_collectives.collectives(ranks, 4)
    seen = hang_report.pace(ranks, None, 0.0)
    assert found[0].outside() == [3] and seen is not None

    stop, evidence = hang_report.judge(ranks, found, seen, None, stalled=False)
    first, second, _ = hang_report.summary(ranks, evidence, "srun.sh got SIGTERM", Path("/r/hang-report.txt"), stop)
    report = hang_report.report_text(ranks, found, "x", Path("/r"), seen=seen, stop=stop, found=evidence)

    assert (
        first
        == "srun.sh: hang report (srun.sh got SIGTERM): training was progressing: last step 7, 0.10 s before the stop"
    )
    assert second == "srun.sh:   an ordinary stop: 4 of 4 ranks answered; the longest step so far took 0.30 s"
    assert "not in it" not in report and "Progress: training was progressing: last step 7" in report
    assert hang_report.judge(ranks, found, seen, None, stalled=True)[0] is None  # a stall keeps the analysis


def test_a_collective_entered_less_than_the_longest_step_before_the_request_is_not_evidence():
    entered = 1_000_000.0 - 0.2
    ahead = dump([entry("0", 8, "started") | {"time_created_ns": int(entered * 1e9)}], {"0": (8, 7)}, "[0, 1]")
    behind = dump([entry("0", 7, "completed")], {"0": (7, 7)}, "[0, 1]")
    ranks = ranks_with({0: ahead, 1: behind})
    for rank in ranks.values():
        rank.answer = answered(7, 30.0, 0.5)  # no step for 30 s: no progressing job
    seen = hang_report.pace(ranks, None, 0.0)
    found = hang_collectives.collectives(ranks, 2)

    assert found[0].entered_s == pytest.approx(0.2, abs=0.01)
    assert hang_collectives.evidence(found, seen.longest_step_s) == []
    old = dump(
        [entry("0", 8, "started") | {"time_created_ns": int((1_000_000.0 - 29.0) * 1e9)}], {"0": (8, 7)}, "[0, 1]"
    )
    ranks[0].dump = old
    assert hang_collectives.evidence(hang_collectives.collectives(ranks, 2), seen.longest_step_s)[0].outside() == [1]


def test_no_step_time_before_the_second_step():
    ranks = ranks_with({0: dump([], {})})
    ranks[0].answer = {"time": 5.0, "last_step": 1, "last_step_time": 4.0, "longest_step_s": None}

    assert hang_report.pace(ranks, None, 0.0) is None


def start_up_barrier(entered_s_ago: float) -> dict[int, Rank]:
    """Four ranks before their first step: 0-2 in the start-up all-reduce (entered `entered_s_ago` before the
    request), rank 3 not yet there (a slower checkpoint load)."""
    asked = 1_000_000.0
    ahead = dump([entry("0", 1, "started") | {"time_created_ns": int((asked - entered_s_ago) * 1e9)}], {"0": (1, 0)})
    ranks = ranks_with({0: ahead, 1: ahead, 2: ahead, 3: dump([], {"0": (0, 0)})})
    for rank in ranks.values():
        rank.answer = {"time": asked, "distributed": True, "last_step": None, "last_step_time": None}
    return ranks


@pytest.mark.parametrize("watch", [{"launched": 0.0, "limit_s": 1200.0, "since_s": 40.0}, None])
def test_stop_during_start_up_blames_nobody_though_a_rank_is_not_yet_in_the_collective(watch: dict | None):
    ranks = start_up_barrier(entered_s_ago=30.0)
    found = hang_collectives.collectives(ranks, 4)
    assert found[0].outside() == [3] and hang_report.pace(ranks, None, 0.0) is None

    stop, evidence = hang_report.judge(ranks, found, None, watch, stalled=False)
    first, second, _ = hang_report.summary(ranks, evidence, "srun.sh got SIGINT", Path("/r/hang-report.txt"), stop)
    report = hang_report.report_text(ranks, found, "x", Path("/r"), seen=None, stop=stop, found=evidence)

    after = ", 40 s after the launch" if watch else ""
    assert first == (
        f"srun.sh: hang report (srun.sh got SIGINT): stopped during start-up: no training step had completed{after};"
        " nothing is blamed (a stop is not a stall)"
    )
    because = "the hang watch would call it a stall after 1200 s" if watch else "the hang watch is off"
    assert second.startswith(f"srun.sh:   an ordinary stop: 4 of 4 ranks answered; {because}")
    assert "not in it" not in report and "entered 30.0 s before the request" in report
    stalled, evidence = hang_report.judge(ranks, found, None, watch, stalled=True)
    assert stalled is None and evidence[0].outside() == [3]  # the hang watch's stall keeps the analysis


def test_stop_during_start_up_blames_what_is_older_than_the_hang_watchs_limit():
    """With the watch off, or a stop in the second before its poll: the watch would have called it a stall."""
    ranks = start_up_barrier(entered_s_ago=1300.0)
    watch = {"launched": 0.0, "limit_s": 1200.0, "since_s": 1310.0}
    stop, evidence = hang_report.judge(ranks, hang_collectives.collectives(ranks, 4), None, watch, stalled=False)
    first, second, _ = hang_report.summary(ranks, evidence, "srun.sh got SIGINT", Path("/r/hang-report.txt"), stop)

    assert (
        stop is None and first.endswith("; 1 rank(s) not in it") and second.startswith("srun.sh:   not in it: rank 3")
    )


def test_stop_at_start_names_the_rank_that_never_joined_only_after_the_hang_watchs_limit():
    ranks = {
        0: Rank(0, "node1", registered={"pid": 100}, answer={"distributed": False}, frames=["rendezvous (x.py:1)"]),
        1: Rank(1, "node1", registered={"pid": 101}, answer={"distributed": False}, frames=["import_module (y:2)"]),
    }
    early = {"launched": 0.0, "limit_s": 1200.0, "since_s": 5.0}
    assert hang_report.judge(ranks, [], None, early, stalled=False)[0] is not None
    late = {**early, "since_s": 1201.0}
    stop, found = hang_report.judge(ranks, [], None, late, stalled=False)
    first, _, _ = hang_report.summary(ranks, found, "srun.sh got SIGTERM", Path("/r/hang-report.txt"), stop)

    assert stop is None and "hang at start: 1 rank(s) never joined torch.distributed" in first


def test_a_stop_after_the_first_step_is_before_a_step_time_is_known():
    ranks = start_up_barrier(entered_s_ago=0.5)
    for rank in ranks.values():
        rank.answer |= {"last_step": 1, "last_step_time": 1_000_000.0 - 0.6, "longest_step_s": None}
    watch = {"launched": 0.0, "limit_s": 300.0, "since_s": 62.3}

    stop, _ = hang_report.judge(ranks, hang_collectives.collectives(ranks, 4), None, watch, stalled=False)

    assert stop is not None and stop.says == (
        "stopped before the second step: step 1 had completed, 62 s after the launch;"
        " nothing is blamed (a stop is not a stall)"
    )


def test_hang_watch_keeps_its_limit_for_the_report(tmp_path: Path):
    """The real watch (SRUNSH_HANG_TIMEOUT_S=40), in its thread: 1200 s before the first step, then its fixed timeout;
    it ends when told to."""
    started, stop, stalls = time.time(), threading.Event(), []
    watch = threading.Thread(target=hang_watch.watch, args=(tmp_path, 40.0, stalls.append, stop), daemon=True)
    watch.start()
    record = tmp_path / "hang" / "watch.json"
    try:
        limits = []
        deadline = time.monotonic() + 30
        while len(limits) < 2:
            assert time.monotonic() < deadline, limits
            seen = progress.read_json(record)
            if seen and seen["limit_s"] not in limits:
                limits.append(seen["limit_s"])
                assert started - 1 <= seen["launched"] <= time.time()
                (tmp_path / "hang" / "progress.json").write_text(json.dumps(step(1)))
            time.sleep(0.1)
    finally:
        stop.set()
        watch.join(timeout=10)

    assert limits == [1200.0, 40.0]
    assert not watch.is_alive() and stalls == [] and not (tmp_path / "hang" / "stalled.txt").exists()


def test_hang_watch_says_why_in_stalled_txt_and_calls_back_once_then_ends(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(hang_watch, "START_LIMIT_S", 0.3)
    monkeypatch.setattr(hang_watch, "POLL_S", 0.05)
    stalls: list[str] = []
    watch = threading.Thread(target=hang_watch.watch, args=(tmp_path, None, stalls.append, threading.Event()))
    watch.start()
    watch.join(timeout=10)

    assert not watch.is_alive()
    (why,) = stalls
    assert why.startswith("no training step completed in the ") and why.endswith(
        " s since the launch (the limit before the first step, 0.3 s)"
    )
    assert (tmp_path / "hang" / "stalled.txt").read_text() == why + "\n"


def registered_as(pid: int, host: str) -> dict:
    return {"pid": pid, "host": host, "start_time": hang_answers.process_start_time(pid), "main_thread": 1}


def test_rank_that_did_not_answer_on_this_host_is_named_with_its_process_state():
    here = socket.gethostname()
    frozen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(frozen.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while hang_answers.process_state(registered_as(frozen.pid, here)) != "stopped (T)":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        ranks = {
            0: Rank(0, here, registered=registered_as(os.getpid(), here), answer={"last_step": 3}, frames=["x (y:1)"]),
            1: Rank(1, here, registered=registered_as(frozen.pid, here)),
        }
        first, second, _ = hang_report.summary(ranks, [], "no step for 40 s", Path("/r/hang-report.txt"))
    finally:
        frozen.kill()
        frozen.wait()

    assert first == (
        f"srun.sh: hang report (no step for 40 s): 1 rank(s) did not answer: rank 1 on {here} (pid {frozen.pid}):"
        " stopped (T)"
    )
    assert second == "srun.sh:   no rank waits in a collective that another rank is not in; 1 of 2 answered, at step 3"
    assert hang_answers.process_state(ranks[1].registered) == "its process is gone"


def test_rank_on_another_host_is_no_answer_from_that_node_even_where_this_host_could_read_its_pid():
    """On the test cluster the nodes are namespaces of one machine: a pid of node2 is readable here. What counts is the
    host it registered from."""
    ranks = {
        0: Rank(0, "node2", registered=registered_as(os.getpid(), "node2")),
        1: Rank(1, "node2", registered=registered_as(os.getpid(), "node2"), answer={"last_step": 3}),
        2: Rank(2, "node3", registered=registered_as(os.getpid(), "node3")),
        3: Rank(3, "node3", registered=registered_as(os.getpid(), "node3")),
    }

    first, _, _ = hang_report.summary(ranks, [], "why", Path("/r"))

    assert first == (
        f"srun.sh: hang report (why): 3 rank(s) did not answer: rank 0 on node2 (pid {os.getpid()}): no answer from"
        " node node2 (rank 1 on it answered); ranks 2-3 on node3: no answer from node node3"
    )


def test_recorder_keeps_the_longest_step_but_not_the_start_nor_a_checkpoint_save(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(progress, "LAST", progress.Last())  # a process records one training
    recorder = progress.Recorder(tmp_path, rank=1)
    recorder.record(1)
    time.sleep(0.05)
    recorder.record(2, "saving")
    time.sleep(0.3)  # the save
    recorder.record(2)
    time.sleep(0.1)
    recorder.record(3)

    assert progress.LAST.step == 3 and 0.1 <= progress.LAST.longest_step_s < 0.3
    assert abs(progress.LAST.time - time.time()) < 0.1


def test_a_stop_whose_answers_lag_behind_the_stacks_reads_the_pace_from_the_step_record(tmp_path: Path, monkeypatch):
    """On the H200 a rank's stacks came at a stop at step 30 but its answer (written after its flight-recorder dump)
    did not within the grace: the report said "stopped during start-up" of a job 30 steps in. Rank 0's step record,
    written by the real launcher/hang/progress.py, says where training was."""
    monkeypatch.setattr(progress, "LAST", progress.Last())  # a process records one training
    recorder = progress.Recorder(tmp_path, rank=0)
    for step in range(26, 31):  # 0.05 s steps
        time.sleep(0.05)
        recorder.record(step)
    record = json.loads((tmp_path / "hang" / "progress.json").read_text())
    ranks = ranks_with({0: dump([entry("0", 31, "started")], {"0": (31, 30)})})
    ranks[0].answer = None  # its stacks came, its answer did not
    ranks[0].frames = ["File train.py, line 1 in train_step"]

    seen = hang_report.pace(ranks, record, record["time"] + 0.02)
    stop, found = hang_report.judge(ranks, hang_collectives.collectives(ranks, 1), seen, None, stalled=False)

    assert seen is not None and seen.step == 30 and record["longest_step_s"] is not None
    assert stop is not None and stop.says.startswith("training was progressing: last step 30") and found == []


# A rank as entrypoint.py makes it for the hang report (launcher/hang/dumps.py's handler, launcher/hang/progress.py's
# last step), whose main thread then waits in a function of its own: step 7 completed SINCE s ago, the longest took 2 s.
RANK_PROGRAM = """
import sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
from launcher.hang import dumps, progress
dumps.install(Path(sys.argv[1]), int(sys.argv[2]))
progress.LAST.step, progress.LAST.time, progress.LAST.longest_step_s = 7, time.time() - float(sys.argv[3]), 2.0
def waiting_in_step():
    print("ready", flush=True)
    time.sleep(3600)
waiting_in_step()
"""


@pytest.fixture
def start_ranks():
    started: list[subprocess.Popen] = []

    def start(run_dir: Path, ranks: int, since_s: float) -> list[subprocess.Popen]:
        program = RANK_PROGRAM.format(repo=str(Path(hang_report.__file__).parents[2]))
        for rank in range(ranks):
            command = [sys.executable, "-c", program, str(run_dir), str(rank), str(since_s)]
            started.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
        assert [process.stdout.readline() for process in started] == ["ready\n"] * ranks
        deadline = time.monotonic() + 30
        while any(hang_answers.process_stat(process.pid)[0] != "S" for process in started):  # each in its sleep
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return started

    yield start
    for process in started:
        process.kill()
        process.wait()


def hang_report_main(run_dir: Path, world: int, monkeypatch, *flags: str) -> int:
    argv = [str(run_dir), "--why", "no step for 40 s", "--world-size", str(world), "--nodes", socket.gethostname()]
    monkeypatch.setattr(sys, "argv", ["report.py", *argv, "--ranks-per-node", str(world), *flags])
    return hang_report.main()


def test_report_of_running_ranks_that_answer_names_where_they_are_and_what_they_did_not_say(
    tmp_path, start_ranks, monkeypatch, capsys
):
    here = socket.gethostname()
    ranks = start_ranks(tmp_path, 3, since_s=100.0)
    os.kill(ranks[2].pid, signal.SIGSTOP)  # it can say nothing
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank-3.status").write_text(f"1 1796117746 {here}\n")  # ended before the report
    (tmp_path / "hang" / "answer-rank-0.json").write_text('{"rank": 0, "last_step": 99}')  # an earlier report's
    monkeypatch.setattr(hang_answers, "ANSWER_WAIT_S", 2.0)

    assert hang_report_main(tmp_path, 4, monkeypatch, "--local") == 0

    report = tmp_path / "hang-report.txt"
    assert capsys.readouterr().err.splitlines() == [
        f"srun.sh: hang report (no step for 40 s): 1 rank(s) did not answer: rank 2 on {here} (pid {ranks[2].pid}):"
        " stopped (T)",
        "srun.sh:   no rank waits in a collective that another rank is not in; 2 of 4 answered, at step 7",
        f"srun.sh:   every rank's top frames and torch's analysis: {report}",
    ]
    text = report.read_text().splitlines()
    assert text[0].startswith(f"Hang report of run {tmp_path.name}, 20") and text[0].endswith(" UTC")
    assert text[1:4] == [
        "Why: no step for 40 s",
        "Ranks: 4 on 1 host(s); stacks from 2, answers from 2, flight recorder records from 0",
        text[3],
    ]
    assert re.fullmatch(r"Progress: last step 7, 10\d\.\d s before the ranks were asked; the longest step so far took"
                        r" 2\.00 s", text[3])  # fmt: skip
    assert text[4:6] == [
        "Did not answer (seen from " + here + "):",
        f"  rank 2 on {here} (pid {ranks[2].pid}): stopped (T)",
    ]
    frames = text.index("Main threads, top 6 frames (most recent first):")
    assert text[frames + 1 : frames + 5] == [
        f"  rank 2 on {here} (pid {ranks[2].pid}): no stacks",
        f"  rank 3 on {here}: it had ended, with exit status 1",
        f"  ranks 0-1 on {here}",
        "      waiting_in_step (<string>:10)",
    ]
    assert text[-3:] == [
        "  no flight recorder records came",
        "",
        f"Records: {tmp_path / 'hang'}/: stacks-rank-R.txt (every thread of rank R), fr/rank-R (flight recorder),"
        " answer-rank-R.json",
    ]
    assert json.loads((tmp_path / "hang" / "answer-rank-0.json").read_text())["last_step"] == 7


def test_stop_of_running_ranks_a_moment_after_their_last_step_is_an_ordinary_stop(
    tmp_path, start_ranks, monkeypatch, capsys
):
    start_ranks(tmp_path, 2, since_s=0.5)

    assert hang_report_main(tmp_path, 2, monkeypatch, "--local") == 0

    first, second, _ = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"srun.sh: hang report \(no step for 40 s\): training was progressing: last step 7, 0\.\d\d s"
                        r" before the stop", first)  # fmt: skip
    assert second == "srun.sh:   an ordinary stop: 2 of 2 ranks answered; the longest step so far took 2.00 s"
    text = (tmp_path / "hang-report.txt").read_text()
    assert (
        "Collectives in flight when the ranks were asked (torch's flight recorder, oldest first per group):\n  none\n"
        in text
    )
    assert "torch's analysis:\n  not run: an ordinary stop\n" in text


def test_a_stall_of_running_ranks_is_no_ordinary_stop_though_their_last_step_was_recent(
    tmp_path, start_ranks, monkeypatch, capsys
):
    start_ranks(tmp_path, 2, since_s=0.5)

    assert hang_report_main(tmp_path, 2, monkeypatch, "--local", "--stalled") == 0

    assert capsys.readouterr().err.splitlines()[1] == (
        "srun.sh:   rank 0 on "
        + socket.gethostname()
        + f" (pid {hang_answers.registered_ranks(tmp_path / 'hang')[0]['pid']}):"
        " at waiting_in_step (<string>:10)"
    )


def test_a_job_step_is_signalled_through_scancel_and_its_refusal_is_said(tmp_path, monkeypatch, capsys):
    """A stand-in scancel (the real one needs a controller: tests/test_srun_hang.py) records how it was called."""
    scancel = tmp_path / "bin" / "scancel"
    scancel.parent.mkdir()
    scancel.write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path}/called\necho "scancel: error: Invalid job id 42.0" >&2\nexit 1\n'
    )
    scancel.chmod(0o755)
    monkeypatch.setenv("PATH", f"{scancel.parent}:{os.environ['PATH']}")

    assert hang_report_main(tmp_path, 1, monkeypatch, "--step", "42.0") == 0

    assert (tmp_path / "called").read_text() == "--signal=USR2 42.0\n"
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "srun.sh: hang report: could not signal the ranks: scancel: error: Invalid job id 42.0"
    assert hang_answers.signal_step("x") == "scancel: error: Invalid job id 42.0"
    scancel.write_text("#!/bin/sh\nexit 3\n")
    assert hang_answers.signal_step("x") == "scancel exited 3"
    scancel.write_text("#!/bin/sh\nexit 0\n")
    assert hang_answers.signal_step("x") is None


def subgroup_dump(enqueued: int, completed: int, main: tuple[int, int] = (6, 5)) -> dict:
    """A rank's records of the default group (its collective #6 started on every GPU) and of a subgroup "1" of ranks
    0-1 (no pg_config of it: torch leaves out groups it did not create on that rank), with a p2p entry beside."""
    entries = [entry("0", 6, "started"), entry("1", completed + 1, "started", op="nccl:all_gather", pg_id=1)]
    entries.append(entry("1", 99, "started", op="nccl:send", pg_id=1) | {"is_p2p": True})
    entries[1]["process_group"] = ("1", "undefined")
    return dump(entries, {"0": main, "1": (enqueued, completed)})


def test_a_group_with_a_member_outside_its_collective_comes_before_a_larger_group_that_every_member_is_in():
    ranks = ranks_with(
        {0: subgroup_dump(3, 2), 1: subgroup_dump(2, 2), 2: dump([entry("0", 6, "started")], {"0": (6, 5)})}
    )
    ranks |= ranks_with({3: dump([entry("0", 6, "started")], {"0": (6, 5)})})

    found = hang_collectives.collectives(ranks, 4)

    assert [(c.group, c.seq, c.members, c.outside(), c.gpu_states) for c in found] == [
        ("1", 3, [0, 1], [1], "started"),
        ("0", 6, [0, 1, 2, 3], [], "started"),
    ]
    assert found[0].name() == "nccl:all_gather #3 of process group 1 (ranks 0-1)" and found[0].sizes == "[[1024]]"
    assert hang_report.summary(ranks, found, "why", Path("/r/hang-report.txt")) == [
        "srun.sh: hang report (why): rank 0 waits in nccl:all_gather #3 of process group 1 (ranks 0-1); 1 rank(s) not"
        " in it",
        "srun.sh:   not in it: rank 1 on node1 (pid 101): it waits in nccl:all_reduce #6 of process group 0",
        "srun.sh:   every rank's top frames and torch's analysis: /r/hang-report.txt",
    ]
    assert hang_report.findings_lines(ranks, found, 2) == [
        "Collectives not completed by every member (torch's flight recorder, oldest first per group):",
        "  nccl:all_gather #3 of process group 1 (ranks 0-1), sizes [[1024]]",
        "    in nccl:all_gather: ranks 0",
        "    not in it: rank 1 on node1 (pid 101): it waits in nccl:all_reduce #6 of process group 0",
        "  nccl:all_reduce #6 of process group 0 (default_pg, ranks 0-3), sizes [[1024]]",
        "    in nccl:all_reduce: ranks 0-3",
        "  and 2 entered too recently before the ranks were asked to tell anything",
    ]


def test_a_member_without_records_is_not_in_the_collective_and_the_group_waits_for_it():
    ranks = ranks_with({0: dump([entry("0", 2, "started")], {"0": (2, 1)}, ranks="[0, 1, 2]")})
    ranks |= ranks_with({1: dump([entry("0", 2, "started")], {"0": (2, 1)}, ranks="[0, 1, 2]")})
    ranks[2] = Rank(2, "node2", registered={"pid": 102}, answer={"distributed": True, "last_step": 5})

    (found,) = hang_collectives.collectives(ranks, 3)

    assert (found.silent, found.behind, found.outside(), found.waiting()) == ([2], [], [2], [0, 1])
    assert hang_report.summary(ranks, [found], "why", Path("/r"))[:2] == [
        "srun.sh: hang report (why): ranks 0-1 wait in nccl:all_reduce #2 of process group 0 (default_pg, ranks 0-2);"
        " 1 rank(s) not in it",
        "srun.sh:   not in it: rank 2 on node2 (pid 102): no answer",
    ]


@pytest.mark.parametrize(
    ("timed", "says"),
    [
        (True, "srun.sh:   no member's GPU started it: the work queued before it is stuck on every member"),
        (False, "srun.sh:   suspect the network between node1, node2, or stuck GPUs (see the top frames)"),
    ],
)
def test_a_collective_no_gpu_started_is_work_stuck_before_it_only_where_starts_are_recorded(timed: bool, says: str):
    earlier = entry("0", 4, "completed") | {"time_discovered_started_ns": 1 if timed else None}
    queued = dump([earlier, entry("0", 5, "scheduled")], {"0": (5, 4)})
    ranks = ranks_with({n: queued for n in range(4)})

    found = hang_collectives.collectives(ranks, 4)

    assert found[0].gpu_states == ("scheduled" if timed else "")
    assert hang_report.summary(ranks, found, "why", Path("/r"))[:2] == [
        "srun.sh: hang report (why): every member of nccl:all_reduce #5 of process group 0 (default_pg, ranks 0-3) is"
        " in it, and none completed it",
        says,
    ]


def test_a_rank_whose_gpu_never_started_it_is_in_the_not_in_it_line_and_not_among_those_waiting():
    """Issue 38: that list dropped from the "not in it" line went unnoticed."""
    started = dump([entry("0", 9, "started")], {"0": (9, 8)}, ranks="[0, 1, 2]")
    queued = dump([entry("0", 8, "completed"), entry("0", 9, "scheduled")], {"0": (9, 8)}, ranks="[0, 1, 2]")
    ranks = ranks_with({0: started, 1: started, 2: queued})

    found = hang_collectives.collectives(ranks, 3)
    first, second, _ = hang_report.summary(ranks, found, "why", Path("/r"))

    assert first == (
        "srun.sh: hang report (why): ranks 0-1 wait in nccl:all_reduce #9 of process group 0 (default_pg, ranks 0-2);"
        " 1 rank(s) not in it"
    )
    assert second == (
        "srun.sh:   not in it: rank 2 on node2 (pid 102): its GPU never started it (the work queued before it is"
        " stuck), at x (y.py:1)"
    )


def test_a_hang_at_start_names_the_ranks_that_never_joined_and_those_waiting_for_them():
    rendezvous = ["_store_based_barrier (/site/torch/distributed/distributed_c10d.py:1)", "main (entrypoint.py:3)"]
    ranks = {
        n: Rank(n, "node1", registered={"pid": 100 + n}, answer={"distributed": False}, frames=rendezvous)
        for n in range(3)
    }
    ranks[3] = Rank(3, "node2", registered={"pid": 103}, answer={"distributed": False}, frames=["load (data.py:7)"])
    ranks[4] = Rank(4, "node2")  # never registered: it had not started entrypoint.py's hang handler

    lines = hang_report.summary(ranks, [], "why", Path("/r"))

    assert lines[:2] == [
        "srun.sh: hang report (why): hang at start: 2 rank(s) never joined torch.distributed; ranks 0-2 wait for them"
        " in the rendezvous",
        "srun.sh:   never joined: rank 3 on node2 (pid 103): at load (data.py:7); rank 4 on node2: no answer: it had"
        " not started entrypoint.py's hang handler",
    ]
    assert hang_report.findings_lines(ranks, [], 0)[:4] == [
        "Start: not every rank joined torch.distributed (its rendezvous, init_process_group)",
        "  waiting in the rendezvous: ranks 0-2",
        "  never joined: rank 3 on node2 (pid 103): at load (data.py:7)",
        "  never joined: rank 4 on node2: no answer: it had not started entrypoint.py's hang handler",
    ]


def test_gather_reads_each_ranks_records_written_since_the_request(tmp_path: Path):
    hang = tmp_path / "hang"
    (hang / "fr").mkdir(parents=True)
    record = dump([entry("0", 2, "started")], {"0": (2, 1)}, ranks="[0, 1, 2]")
    (hang / "fr" / "rank-0").write_bytes(pickle.dumps(record))
    (hang / "fr" / "rank-1").write_bytes(b"not a pickle")
    for rank in range(2):
        registered = {"rank": rank, "host": f"n{rank}", "pid": 10 + rank, "start_time": "1", "main_thread": 16}
        (hang / f"rank-{rank}.json").write_text(json.dumps(registered))
        (hang / f"answer-rank-{rank}.json").write_text(json.dumps({"flight_recorder": f"rank-{rank}", "last_step": 4}))
    earlier = 'Thread 0x0000000000000010 (most recent call first):\n  File "old.py", line 1 in before\n'
    now = 'Thread 0x0000000000000010 (most recent call first):\n  File "/x/train.py", line 9 in step\n'
    (hang / "stacks-rank-0.txt").write_text(earlier + now)

    ranks = hang_answers.gather(tmp_path, 4, ["h0", "h1", "h2"], {0: len(earlier)}, {2: "it had ended"})

    assert [(r.host, r.frames, r.ended) for r in ranks.values()] == [
        ("n0", ["step (/x/train.py:9)"], None),
        ("n1", [], None),
        ("h2", [], "it had ended"),
        ("?", [], None),
    ]
    assert ranks[0].dump == record and ranks[1].dump is None and ranks[0].answer["last_step"] == 4
    assert ranks[2].registered is None and ranks[2].answer is None
    assert hang_answers.registered_ranks(hang)[1]["pid"] == 11


def test_torchs_analysis_is_run_on_nccls_records_and_its_output_kept(tmp_path: Path, monkeypatch):
    """torchfrtrace itself takes 15-20 s to start here (tests/gpu runs it on real records); a stand-in interpreter
    stands for it, to show how its output and exit status reach the report."""
    stand_in = tmp_path / "python"
    stand_in.write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path}/called\nfor i in $(seq 1 70); do echo "line $i"; done\nexit 3\n'
    )
    stand_in.chmod(0o755)
    nccl = ranks_with({0: dump([entry("0", 2, "started")], {"0": (2, 1)})})
    gloo = ranks_with({0: dump([entry("0", 2, "started", op="gloo:all_reduce")], {"0": (2, 1)})})
    fr = tmp_path / "fr"
    command = f"torchfrtrace {fr} -p rank- --allow-incomplete-ranks"

    assert hang_collectives.torch_analysis({0: Rank(0, "h")}, fr) == ["  no flight recorder records came"]
    assert hang_collectives.torch_analysis(gloo, fr) == [
        "  torchfrtrace reads NCCL's records only; these are gloo's (the analysis above reads them)"
    ]
    monkeypatch.setattr(sys, "executable", str(stand_in))
    lines = hang_collectives.torch_analysis(nccl, fr)
    assert lines == [f"  `{command}` (exit status 3):", *(f"    line {i}" for i in range(11, 71))]
    called = "-m torch.distributed.flight_recorder.fr_trace " + str(fr) + " -p rank- --allow-incomplete-ranks\n"
    assert (tmp_path / "called").read_text() == called
    monkeypatch.setattr(hang_collectives.importlib.util, "find_spec", lambda name: None)
    assert hang_collectives.torch_analysis(nccl, fr) == [f"  {stand_in} has no torch: run `{command}` where torch is"]


def test_waiting_for_answers_ends_when_they_came_or_a_ranks_stacks_came_a_grace_ago(tmp_path: Path, monkeypatch):
    """A rank whose stuck thread holds the GIL writes its stacks (faulthandler needs no GIL) but never its answer."""
    monkeypatch.setattr(hang_answers, "STACKS_GRACE_S", 0.3)
    monkeypatch.setattr(hang_answers, "ANSWER_WAIT_S", 2.5)
    (tmp_path / "answer-rank-0.json").write_text("{}")
    (tmp_path / "stacks-rank-1.txt").write_text("earlier\nnow\n")
    pending = {0, 1}

    started = time.monotonic()
    hang_answers.wait_for_answers(tmp_path, pending, {1: len("earlier\n")})
    waited = time.monotonic() - started

    assert pending == set() and 0.3 < waited < 2.0
    pending = {1}
    started = time.monotonic()
    hang_answers.wait_for_answers(tmp_path, pending, {1: len("earlier\nnow\n")})  # no new stacks: the whole wait
    assert pending == {1} and time.monotonic() - started >= 2.5


def test_a_rank_that_did_not_answer_heads_the_console_in_a_stop_and_in_a_finding():
    here = socket.gethostname()
    answered = Rank(0, "node9", registered={"pid": 1}, answer={"last_step": 3}, frames=["x (y.py:1)"])
    silent = Rank(1, "node9", registered={"pid": 2, "start_time": "x"})
    ranks = {0: answered, 1: silent}
    stop = hang_report.Stop("training was progressing: last step 3, 0.50 s before the stop", "because")

    assert hang_report.summary(ranks, [], "why", Path("/r"), stop)[:2] == [
        "srun.sh: hang report (why): training was progressing: last step 3, 0.50 s before the stop",
        "srun.sh:   1 rank(s) did not answer: rank 1 on node9 (pid 2): no answer from node node9 (rank 0 on it"
        " answered)",
    ]
    assert hang_report.summary(ranks, [], "why", Path("/r"))[:2] == [
        "srun.sh: hang report (why): 1 rank(s) did not answer: rank 1 on node9 (pid 2): no answer from node node9"
        " (rank 0 on it answered)",
        "srun.sh:   no rank waits in a collective that another rank is not in; 1 of 2 answered, at step 3",
    ]
    assert here != "node9"


def test_the_console_names_three_ranks_and_counts_the_rest():
    ranks = {n: Rank(n, f"node{n}", answer={"distributed": False}, frames=[f"f{n} (a.py:{n})"]) for n in range(5)}
    ranks |= {n: Rank(n, "nodeX", registered={"pid": n, "start_time": "x"}) for n in range(5, 10)}
    ranks[10] = Rank(10, "nodeY", registered={"pid": 10, "start_time": "x"})
    ranks[11] = Rank(11, "nodeZ", registered={"pid": 11, "start_time": "x"})
    ranks[12] = Rank(12, "nodeW", registered={"pid": 12, "start_time": "x"})

    first, second, _ = hang_report.summary(ranks, [], "why", Path("/r"))

    assert first == (
        "srun.sh: hang report (why): 8 rank(s) did not answer: ranks 5-9 on nodeX: no answer from node nodeX;"
        " rank 10 on nodeY (pid 10): no answer from node nodeY; rank 11 on nodeZ (pid 11): no answer from node nodeZ;"
        " and 1 more"
    )
    assert second == "srun.sh:   hang at start: 5 rank(s) never joined torch.distributed"
    assert hang_report.summary({n: ranks[n] for n in range(5)}, [], "why", Path("/r"))[1] == (
        "srun.sh:   never joined: rank 0 on node0: at f0 (a.py:0); rank 1 on node1: at f1 (a.py:1); rank 2 on node2:"
        " at f2 (a.py:2); and 2 more"
    )


def test_process_groups_are_read_by_name_with_their_members_status_and_entries_as_torch_records_them():
    """torch keys pg_status by the group's id and pg_config by its name; entries name both. A p2p entry shares the
    sequence number of the collective it precedes, and is no collective."""
    send = entry("tp", 4, "started", op="nccl:send", pg_id=11) | {"is_p2p": True}
    gather = entry("tp", 4, "started", op="nccl:all_gather", pg_id=11)
    other = entry("x", 2, "scheduled", pg_id=13)
    record = {
        "pg_config": {"tp": {"ranks": "[2, 3]"}, "gone": {"ranks": "[9]"}},
        "pg_status": {
            "11": {"last_enqueued_collective": 4, "last_completed_collective": 3},
            "12": {"last_enqueued_collective": -1, "last_completed_collective": -1},
        },
        "entries": [send, gather, other],
    }

    assert hang_collectives.group_records(record) == {
        "tp": {"desc": "", "members": [2, 3], "enqueued": 4, "completed": 3, "entries": {4: gather}},
        "x": {"desc": "", "members": None, "enqueued": 0, "completed": 0, "entries": {2: other}},
        "12": {"desc": "", "members": None, "enqueued": 0, "completed": 0, "entries": {}},
    }
    assert hang_collectives.group_records({"pg_status": record["pg_status"]})["11"]["enqueued"] == 4
    ranks = ranks_with({2: record})
    ranks[3] = Rank(3, "node2", registered={"pid": 103})

    (found,) = hang_collectives.collectives(ranks, 4)

    assert (found.group, found.members, found.seq, found.silent, found.ops) == (
        "tp",
        [2, 3],
        4,
        [3],
        {"nccl:all_gather": [2]},
    )
    assert found.name() == "nccl:all_gather #4 of process group tp (ranks 2-3)"


def report_main(run_dir: Path, monkeypatch, *flags: str) -> int:
    """hang_report.main for a job of two ranks, one on each of nodes a and b, as launcher/hang.sh calls it."""
    argv = [str(run_dir), "--why", "srun.sh got SIGTERM", "--world-size", "2", "--nodes", "a,b"]
    argv += ["--ranks-per-node", "1"]
    monkeypatch.setattr(sys, "argv", ["report.py", *argv, *flags])
    return hang_report.main()


def test_a_report_before_any_rank_registered_reads_the_watch_and_the_step_record_and_no_earlier_stacks(
    tmp_path, monkeypatch, capsys
):
    """A stop so early that no rank has started its hang handler: the report still comes, with the hang watch's
    limit (watch.json), rank 0's step record (progress.json) and no stacks an earlier report left."""
    run_dir = tmp_path / "runs" / "r1"  # not made yet: the report makes RUN_DIR/hang
    report = run_dir / "hang-report.txt"

    assert report_main(run_dir, monkeypatch, "--local") == 0
    assert capsys.readouterr().err.splitlines() == [
        "srun.sh: hang report (srun.sh got SIGTERM): stopped during start-up: no training step had completed;"
        " nothing is blamed (a stop is not a stall)",
        "srun.sh:   an ordinary stop: 0 of 2 ranks answered; the hang watch is off, so nothing counts as a stall",
        f"srun.sh:   every rank's top frames and torch's analysis: {report}",
    ]
    assert "  ranks 0-1 on a, b: no stacks\n" in report.read_text()

    hang = run_dir / "hang"
    hang_watch.write_limit(hang, time.time() - 40.0, 1200.0)
    (hang / "stacks-rank-0.txt").write_text('Thread 0x10 (most recent call first):\n  File "old.py", line 1 in f\n')
    assert report_main(run_dir, monkeypatch, "--local") == 0
    assert capsys.readouterr().err.splitlines()[:2] == [
        "srun.sh: hang report (srun.sh got SIGTERM): stopped during start-up: no training step had completed,"
        " 40 s after the launch; nothing is blamed (a stop is not a stall)",
        "srun.sh:   an ordinary stop: 0 of 2 ranks answered; the hang watch would call it a stall after 1200 s",
    ]
    assert "  ranks 0-1 on a, b: no stacks\n" in report.read_text()  # the stacks were there before the request

    (hang / "progress.json").write_text(json.dumps({"step": 5, "time": time.time() - 1.0, "longest_step_s": 2.0}))
    assert report_main(run_dir, monkeypatch, "--local") == 0
    first, second, _ = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"srun.sh: hang report \(srun.sh got SIGTERM\): training was progressing: last step 5,"
                        r" 1\.\d\d s before the stop", first)  # fmt: skip
    assert second == "srun.sh:   an ordinary stop: 0 of 2 ranks answered; the longest step so far took 2.00 s"

    assert report_main(run_dir, monkeypatch, "--local", "--stalled") == 0
    assert capsys.readouterr().err.splitlines()[:2] == [
        "srun.sh: hang report (srun.sh got SIGTERM): hang at start: 2 rank(s) never joined torch.distributed",
        "srun.sh:   never joined: rank 0 on a: no answer: it had not started entrypoint.py's hang handler; rank 1 on b:"
        " no answer: it had not started entrypoint.py's hang handler",
    ]


@pytest.mark.parametrize("left_out", ["--why", "--world-size", "--nodes", "--ranks-per-node", "--step"])
def test_a_call_without_a_required_argument_is_refused_and_writes_no_report(left_out, tmp_path, monkeypatch, capsys):
    """The arguments launcher/hang.sh always passes (the usage in the module's docstring), one left out each time."""
    argv = ["--why", "x", "--world-size", "2", "--nodes", "a,b", "--ranks-per-node", "1", "--step", "42.0"]
    at = argv.index(left_out)
    monkeypatch.setattr(sys, "argv", ["report.py", str(tmp_path), *argv[:at], *argv[at + 2 :]])

    with pytest.raises(SystemExit) as refused:
        hang_report.main()

    assert refused.value.code == 2
    needed = "one of the arguments --step --local is required" if left_out == "--step" else left_out
    assert needed in capsys.readouterr().err
    assert not (tmp_path / "hang-report.txt").exists()


def test_help_shows_the_documented_usage_as_written_and_says_what_each_option_does(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(sys, "argv", ["report.py", "--help"])

    with pytest.raises(SystemExit):
        hang_report.main()

    out = capsys.readouterr().out
    usage = [line for line in hang_report.__doc__.splitlines() if "python3 launcher/hang/report.py" in line]
    assert usage and usage[0] in out.splitlines()  # the docstring's own line breaks and indentation
    said = {line.split()[0]: line for line in out.splitlines() if line.startswith("  --")}
    assert "scancel --signal=USR2" in said["--step"]  # as the docstring says --step and --local do
    assert "registered pids" in said["--local"]
    assert "comma-separated" in said["--nodes"]
    assert "hang watch" in said["--stalled"]


def test_the_report_reads_the_hang_watchs_limit_and_how_long_since_the_launch(tmp_path: Path):
    assert hang_report.read_watch(tmp_path, 1045.0) is None  # the watch is off
    hang_watch.write_limit(tmp_path, 1000.0, 30.0)

    assert hang_report.read_watch(tmp_path, 1045.0) == {"launched": 1000.0, "limit_s": 30.0, "since_s": 45.0}


def test_earlier_answers_and_flight_recorder_records_are_forgotten_and_nothing_else(tmp_path: Path):
    hang_answers.forget_earlier_answers(tmp_path)  # no fr/ yet: nothing to do
    kept = ["rank-0.json", "rank-12.json", "stacks-rank-0.txt", "progress.json", "watch.json"]
    gone = ["answer-rank-0.json", "answer-rank-12.json", "fr/rank-0", "fr/rank-12"]
    (tmp_path / "fr").mkdir()
    for name in kept + gone:
        (tmp_path / name).write_text("{}")

    hang_answers.forget_earlier_answers(tmp_path)

    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == sorted(kept)


def test_the_frames_name_a_lone_ranks_last_step_and_keep_ended_ranks_apart_and_at_most_four_hosts():
    frames = ["step (/x/train.py:9)"]
    ranks = {n: Rank(n, f"h{n}", frames=frames) for n in range(4)}
    ranks[4] = Rank(4, "h4", frames=frames, ended="it had ended, with exit status 1")
    ranks[5] = Rank(5, "h5", registered={"pid": 7}, answer={"last_step": 12})

    assert hang_report.frames_by_rank(ranks) == [
        "  rank 4 on h4: it had ended, with exit status 1",
        "      step (train.py:9)",
        "  rank 5 on h5 (pid 7), last step 12: no stacks",
        "  ranks 0-3 on h0, h1, h2, h3",
        "      step (train.py:9)",
    ]
    ranks[4].ended = None
    assert hang_report.frames_by_rank(ranks)[-2:] == ["  ranks 0-4 on h0, h1, h2, h3 ...", "      step (train.py:9)"]
    assert Rank(0, "h").last_step() == "" and Rank(0, "h", answer={"last_step": 3}).last_step() == ", last step 3"


def test_waiting_for_answers_ends_at_once_when_all_came_and_counts_any_stacks_of_a_rank_without_earlier_ones(
    tmp_path: Path, monkeypatch
):
    monkeypatch.setattr(hang_answers, "STACKS_GRACE_S", 0.2)
    monkeypatch.setattr(hang_answers, "ANSWER_WAIT_S", 4.0)
    (tmp_path / "answer-rank-0.json").write_text("{}")
    started = time.monotonic()
    hang_answers.wait_for_answers(tmp_path, {0}, {})
    assert time.monotonic() - started < 2.0

    (tmp_path / "stacks-rank-1.txt").write_text("x")  # one byte, and none before the request
    pending = {1}
    started = time.monotonic()
    hang_answers.wait_for_answers(tmp_path, pending, {})
    assert pending == set() and time.monotonic() - started < 3.0


def test_the_collective_line_names_the_op_most_ranks_are_in_and_lists_each_op_by_how_many_are_in_it():
    """Ranks of one group in different collectives at one sequence number (a program whose ranks took different
    branches): the name is the majority's op, and the lines go from the most ranks to the fewest."""
    ops = ["nccl:all_gather", "nccl:broadcast", "nccl:broadcast", "nccl:broadcast", "nccl:reduce_scatter"]
    ranks = ranks_with({n: dump([entry("0", 3, "started", op=op)], {"0": (3, 2)}, "[0, 1, 2, 3, 4]")
                        for n, op in enumerate(ops)})  # fmt: skip

    (found,) = hang_collectives.collectives(ranks, 5)

    assert hang_report.collective_lines([found]) == [
        "  nccl:broadcast #3 of process group 0 (default_pg, ranks 0-4), sizes [[1024]]",
        "    in nccl:broadcast: ranks 1-3",
        "    in nccl:all_gather: ranks 0",
        "    in nccl:reduce_scatter: ranks 4",
    ]


def test_a_member_ahead_that_completed_it_is_neither_waiting_nor_outside_and_bigger_stalls_come_first():
    """NCCL completes a collective per rank: a broadcast's root may be done while the others wait."""
    ahead = dump([entry("0", 6, "completed")], {"0": (6, 6)})
    stuck = dump([entry("0", 6, "started"), entry("1", 2, "started", pg_id=1)], {"0": (6, 5), "1": (2, 1)})
    stuck["pg_config"]["1"] = {"ranks": "[0, 1]"}
    ranks = ranks_with({0: stuck, 1: stuck, 2: ahead, 3: ahead})

    found = hang_collectives.collectives(ranks, 4)

    assert [(c.group, c.waiting(), c.outside()) for c in found] == [("0", [0, 1], []), ("1", [0, 1], [])]
    waiting_all = dump([entry("0", 6, "started"), entry("1", 2, "started", pg_id=1)], {"0": (6, 5), "1": (2, 1)})
    waiting_all["pg_config"]["1"] = {"ranks": "[0, 1]"}
    ranks = ranks_with({n: waiting_all for n in range(4)})
    assert [c.group for c in hang_collectives.collectives(ranks, 4)] == ["0", "1"]  # 4 ranks wait in 0, 2 in 1


def test_members_and_their_place_come_from_any_rank_that_knows_the_group(monkeypatch):
    """The default group without a pg_config is the whole job; a member whose records lack a group it belongs to
    (it has not created it yet) is behind it; a rank whose buffer no longer holds the entry still waits in it."""
    no_config = dump([entry("0", 2, "started")], {"0": (2, 1)})
    del no_config["pg_config"]
    ranks = ranks_with({0: no_config, 1: no_config})

    (found,) = hang_collectives.collectives(ranks, 3)

    assert (found.members, found.silent) == ([0, 1, 2], [2])
    tp = dump([entry("tp", 3, "started", pg_id=7)], {"7": (3, 2)})
    tp["pg_config"] = {"tp": {"ranks": "[0, 1]"}}
    ranks = ranks_with({0: tp, 1: dump([], {})})

    (found,) = hang_collectives.collectives(ranks, 2)

    assert (found.group, found.seq, found.behind, found.ops) == ("tp", 1, [1], {})
    wrapped = dump([entry("0", 1, "completed")], {"0": (2, 1)}, ranks="[0]")  # entry 2 overwritten in the buffer
    (found,) = hang_collectives.collectives(ranks_with({0: wrapped}), 1)
    assert (found.ops, hang_report.collective_lines([found])[0]) == (
        {"a collective": [0]},
        "  a collective #2 of process group 0 (default_pg, ranks 0), sizes ?",
    )


def test_a_collective_was_entered_as_long_before_the_request_as_its_earliest_waiting_rank_says():
    created_s = 1_796_000_000.0  # the ranks' clocks, in time.time() seconds
    ranks = {}
    for n, ago in enumerate([50.0, 10.0]):
        record = dump([entry("0", 2, "started") | {"time_created_ns": int(created_s * 1e9)}], {"0": (2, 1)}, "[0, 1]")
        ranks[n] = Rank(n, "h", dump=record, answer={"time": created_s + ago})
    ranks[1].answer = None  # its answer did not come: its clock says nothing

    (found,) = hang_collectives.collectives(ranks, 2)

    assert found.entered_s == pytest.approx(50.0, abs=0.01)
    ranks[1].answer = {"time": created_s + 10.0}
    assert hang_collectives.collectives(ranks, 2)[0].entered_s == pytest.approx(50.0, abs=0.01)


def test_a_collective_its_root_completed_while_the_other_member_never_entered_it_is_reported():
    """A broadcast's root may complete it before the others receive: rank 1 completed #6 and waits in #7, rank 0
    never entered #6. The report names rank 0 (it used to fail on the collective that no rank waits in)."""
    behind = dump([entry("0", 5, "completed")], {"0": (5, 5)}, ranks="[0, 1]")
    root = dump([entry("0", 6, "completed", op="nccl:broadcast"), entry("0", 7, "started")], {"0": (7, 6)}, "[0, 1]")
    ranks = ranks_with({0: behind, 1: root})

    (found,) = hang_collectives.collectives(ranks, 2)

    assert (found.seq, found.ops, found.behind) == (6, {}, [0])
    assert hang_report.summary(ranks, [found], "why", Path("/r"))[:2] == [
        "srun.sh: hang report (why): no rank waits in a collective #6 of process group 0 (default_pg, ranks 0-1);"
        " 1 rank(s) not in it",
        "srun.sh:   not in it: rank 0 on node1 (pid 100): at x (y.py:1)",
    ]


def test_the_findings_without_a_collective_say_which_steps_the_ranks_were_at_and_who_answered():
    joined = {"distributed": True}
    ranks = {
        0: Rank(0, "h", answer=joined | {"last_step": 3}, frames=["a (x.py:1)"]),
        1: Rank(1, "h", answer=joined | {"last_step": 4}),  # its answer, not its stacks
        2: Rank(2, "h", answer=joined | {"last_step": 5}),
        3: Rank(3, "h", frames=["b (x.py:2)"], answer=joined),  # no step yet
    }
    head = "srun.sh: hang report (why):"

    assert hang_report.findings(ranks, [], head) == [
        f"{head} no rank waits in a collective that another rank is not in; 4 of 4 answered, at steps 3-5",
        "srun.sh:   rank 0 on h: at a (x.py:1)",
    ]
    ranks = {0: Rank(0, "h", answer=joined), 1: Rank(1, "h", answer=joined)}
    assert hang_report.findings(ranks, [], head) == [
        f"{head} no rank waits in a collective that another rank is not in; 2 of 2 answered",
        "srun.sh:   no stacks came",
    ]
    teardown = ["destroy_process_group (/site/torch/distributed/distributed_c10d.py:2000)"]
    ranks = {0: Rank(0, "h", answer={"distributed": False}, frames=teardown)}
    assert hang_report.findings(ranks, [], head)[0] == (
        f"{head} rank 0 hangs in torch.distributed's teardown: its log has the error that ended training"
    )


def test_every_member_in_it_on_its_gpu_is_said_with_how_to_see_the_transport():
    started = dump([entry("0", 9, "started")], {"0": (9, 8)}, ranks="[0, 1]")
    ranks = ranks_with({0: started, 1: started})

    second = hang_report.summary(ranks, hang_collectives.collectives(ranks, 2), "why", Path("/r"))[1]

    assert second == (
        "srun.sh:   every GPU is in it: suspect the network between node1 (NCCL_DEBUG=INFO shows the transport)"
    )


# ---- What the report file and --help say, and how the ranks are asked (issue 38: the survivors of mutation) -------


def documented_words() -> set[str]:
    """The words the module's docstring, README.md and docs/health.md use."""
    repo = Path(__file__).resolve().parents[1]
    text = hang_report.__doc__ + (repo / "README.md").read_text() + (repo / "docs" / "health.md").read_text()
    return set(re.findall(r"[\w.'=-]+", text.lower()))


def test_help_describes_each_option_in_the_words_of_its_documentation(monkeypatch, capsys):
    """--help says what each option does in the docstring's and the docs' words (its "HOST,..." is comma-separated)."""
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(sys, "argv", ["report.py", "--help"])
    with pytest.raises(SystemExit):
        hang_report.main()
    said = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("  --")}
    known = documented_words() | {"comma-separated"}

    for option, metavar in [("--nodes", "NODES"), ("--step", "STEP"), ("--local", ""), ("--stalled", "")]:
        described = said[option].removeprefix(f"  {option}").strip().removeprefix(metavar).strip()
        words = re.findall(r"[\w.'=-]+", described.lower())
        assert words, option
        assert [w for w in words if not {w, w + "s", w.removesuffix("s")} & known] == [], option


def stalled_job() -> tuple[dict[int, Rank], list[hang_collectives.Collective], hang_report.Pace]:
    """Four ranks of a stall 30 s after step 5 (steps of 2 s): 0-1 in the default group's gloo all-reduce #2 for 60 s
    and in all-gather #3 of their subgroup for 0.1 s; rank 2 (node2) did not answer; rank 3 (node2) never joined."""
    asked = 1_000_000.0
    entries = [entry("0", 2, "started", op="gloo:all_reduce") | {"time_created_ns": int((asked - 60.0) * 1e9)}]
    entries.append(
        entry("1", 3, "started", op="gloo:all_gather", pg_id=1) | {"time_created_ns": int((asked - 0.1) * 1e9)}
    )
    record = dump(entries, {"0": (2, 1), "1": (3, 2)})
    record["pg_config"]["1"] = {"ranks": "[0, 1]"}
    ranks = ranks_with({0: record, 1: record})
    for rank in ranks.values():
        rank.answer = answered(5, 30.0, 2.0, asked) | {"distributed": True}
    ranks[2] = Rank(2, "node2", registered={"pid": 102, "start_time": "x"})
    ranks[3] = Rank(3, "node2", registered={"pid": 103}, answer={"distributed": False}, frames=["load (data.py:7)"])
    return ranks, hang_collectives.collectives(ranks, 4), hang_report.pace(ranks, None, 0.0)


def test_a_stalls_report_counts_what_came_names_what_is_left_out_and_parts_its_sections_with_a_blank_line():
    ranks, in_flight, seen = stalled_job()
    stop, found = hang_report.judge(ranks, in_flight, seen, None, stalled=True)
    assert stop is None and [c.group for c in in_flight] == ["0", "1"]
    assert [c.group for c in found] == ["0"]  # a stall too: the subgroup's 0.1 s (< the longest step) says nothing

    text = hang_report.report_text(ranks, in_flight, "why", Path("/runs/r1"), seen=seen, stop=stop, found=found)

    lines = text.splitlines()
    assert lines[2] == "Ranks: 4 on 2 host(s); stacks from 3, answers from 3, flight recorder records from 2"
    assert lines[lines.index(f"Did not answer (seen from {socket.gethostname()}):") + 1] == (
        "  rank 2 on node2 (pid 102): no answer from node node2 (rank 3 on it answered)"
    )
    assert "  and 1 entered too recently before the ranks were asked to tell anything" in lines
    parts = [part.splitlines()[0] for part in text.removesuffix("\n").split("\n\n")]
    assert [re.sub(r"[:,( ].*", "", part) for part in parts] == [
        "Hang", "Start", "Collectives", "Main", "torch's", "Records"
    ]  # fmt: skip
    assert parts[1] == "Start: not every rank joined torch.distributed (its rendezvous, init_process_group)"


def test_the_report_is_dated_in_utc_whatever_the_hosts_time_zone(monkeypatch):
    ranks, in_flight, seen = stalled_job()
    monkeypatch.setenv("TZ", "XST-5:30")  # POSIX TZ: 5 h 30 min east of UTC
    time.tzset()
    try:
        text = hang_report.report_text(ranks, in_flight, "why", Path("/runs/r1"), seen=seen, stop=None, found=[])
    finally:
        monkeypatch.undo()
        time.tzset()

    dated = text.splitlines()[0].removeprefix("Hang report of run r1, ")
    written = datetime.datetime.strptime(dated, "%Y-%m-%d %H:%M:%S UTC").replace(tzinfo=datetime.UTC)
    assert abs((datetime.datetime.now(datetime.UTC) - written).total_seconds()) < 60


def test_torchs_analysis_is_given_up_after_the_limit_it_names(tmp_path: Path, monkeypatch):
    """torchfrtrace that never ends (a stand-in interpreter that sleeps): the report is written all the same, and says
    after how long it gave up; that many seconds are the limit it ran under (scaled down 1000 times here)."""
    stand_in = tmp_path / "python"
    stand_in.write_text("#!/bin/sh\nexec sleep 30\n")
    stand_in.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(stand_in))
    limits = []
    real_run = subprocess.run

    def run_faster(arguments, **options):
        assert options.get("timeout") is not None, "torchfrtrace runs without a limit"
        limits.append(options["timeout"])
        return real_run(arguments, **(options | {"timeout": options["timeout"] / 1000}))

    monkeypatch.setattr(hang_collectives.subprocess, "run", run_faster)
    nccl = ranks_with({0: dump([entry("0", 2, "started")], {"0": (2, 1)})})

    (line,) = hang_collectives.torch_analysis(nccl, tmp_path / "fr")

    said = re.fullmatch(rf"  `torchfrtrace {tmp_path / 'fr'} -p rank- --allow-incomplete-ranks` took more than (\d+) s;"
                        r" run it yourself", line)  # fmt: skip
    assert said and limits == [float(said.group(1))]


def test_torchs_analysis_reads_the_records_where_the_ranks_wrote_them(tmp_path: Path, monkeypatch):
    """launcher/hang/dumps.py writes rank R's record to RUN_DIR/hang/fr/rank-R; a stand-in interpreter lists the
    folder that torchfrtrace is given."""
    stand_in = tmp_path / "python"
    stand_in.write_text('#!/bin/sh\nls "$3"\n')
    stand_in.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(stand_in))
    run_dir = tmp_path / "r1"
    record = dump([entry("0", 2, "started")], {"0": (2, 1)}, ranks="[0]")
    (run_dir / "hang" / "fr").mkdir(parents=True)
    (run_dir / "hang" / "fr" / "rank-0").write_bytes(pickle.dumps(record))
    ranks = ranks_with({0: record})

    text = hang_report.report_text(ranks, [], "why", run_dir, seen=None, stop=None, found=[])

    analysis = text.split("torch's analysis:\n")[1].split("\n\n")[0]
    assert analysis == (
        f"  `torchfrtrace {run_dir / 'hang' / 'fr'} -p rank- --allow-incomplete-ranks` (exit status 0):\n    rank-0"
    )


def test_a_main_thread_waiting_in_the_standard_librarys_threading_is_placed_at_its_own_caller():
    """A real faulthandler dump of a main thread in threading.Event.wait: the position names the code that waits."""
    program = textwrap.dedent(
        """
        import faulthandler, threading
        def waiting_for_the_loader():
            done = threading.Event()
            threading.Timer(0.4, done.set).start()
            faulthandler.dump_traceback_later(0.1)
            done.wait()
            print(threading.main_thread().ident)
        waiting_for_the_loader()
        """
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)

    frames = hang_answers.main_thread_frames(result.stderr, int(result.stdout.strip()))
    assert frames[0].startswith("wait (") and "threading.py:" in frames[0]
    assert re.fullmatch(r"wait \(threading\.py:\d+\) from waiting_for_the_loader \(<string>:7\)",
                        hang_answers.position(frames))  # fmt: skip


def test_stacks_of_a_rank_that_had_written_none_before_the_request_are_read_whole(tmp_path: Path):
    hang = tmp_path / "hang"
    hang.mkdir()
    before = {0: hang_answers.stacks_size(hang, 0)}  # no stacks file yet
    (hang / "stacks-rank-0.txt").write_text(
        'Thread 0x10 (most recent call first):\n  File "/x/train.py", line 9 in step\n'
    )

    (rank,) = hang_answers.gather(tmp_path, 1, ["h0"], before, {}).values()

    assert before == {0: 0} and rank.frames == ["step (/x/train.py:9)"]


def sleeper() -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", "import sys, time; print(flush=True); time.sleep(60)"],
                               stdout=subprocess.PIPE)  # fmt: skip
    process.stdout.readline()  # started: SIGUSR2 now ends it (its default action)
    return process


def test_local_signals_each_rank_that_is_still_its_registered_process_and_no_reused_pid(tmp_path: Path):
    reused, rank = sleeper(), sleeper()
    try:
        registered = {
            0: {"pid": reused.pid, "start_time": "1"},  # its pid, now another process's (it started later)
            1: {"pid": rank.pid, "start_time": hang_answers.process_start_time(rank.pid)},
        }
        assert hang_answers.process_state(registered[0]) == "its process is gone"

        assert hang_answers.signal_local(registered) is None

        assert rank.wait(timeout=10) == -signal.SIGUSR2
        with pytest.raises(subprocess.TimeoutExpired):
            reused.wait(timeout=0.5)
    finally:
        for process in (reused, rank):
            process.kill()
            process.wait()


def test_local_signals_the_other_ranks_when_one_ends_between_its_check_and_its_signal(monkeypatch):
    ending, rank = sleeper(), sleeper()
    real_live_state = hang_answers.live_state

    def ends_right_after(record: dict) -> str | None:
        state = real_live_state(record)
        if record["pid"] == ending.pid:
            ending.kill()
            ending.wait()  # gone: its pid no longer names a process
        return state

    monkeypatch.setattr(hang_answers, "live_state", ends_right_after)
    try:
        registered = {n: {"pid": p.pid, "start_time": hang_answers.process_start_time(p.pid)}
                      for n, p in enumerate((ending, rank))}  # fmt: skip

        assert hang_answers.signal_local(registered) is None

        assert rank.wait(timeout=10) == -signal.SIGUSR2
    finally:
        for process in (ending, rank):
            process.kill()
            process.wait()


def test_a_process_state_that_proc_5_lists_and_the_table_does_not_is_named_by_its_letter(monkeypatch):
    """proc(5)'s P (parked, Linux 3.9-3.13), read from this process's real /proc/PID/stat with its state replaced."""
    real = hang_answers.process_stat(os.getpid())
    monkeypatch.setattr(hang_answers, "process_stat", lambda pid: ["P", *real[1:]])

    assert hang_answers.process_state({"pid": os.getpid(), "start_time": real[19]}) == "in state P"


def test_waiting_for_many_answers_that_all_came_ends_after_one_look(tmp_path: Path):
    """Every answer there at the first look: the wait ends then, however many ranks (not one rank a look)."""
    for rank in range(8):
        (tmp_path / f"answer-rank-{rank}.json").write_text("{}")
    pending = set(range(8))
    started = time.monotonic()

    hang_answers.wait_for_answers(tmp_path, pending, {})

    assert pending == set() and time.monotonic() - started < 2.0


def test_a_p2p_entry_after_a_collective_keeps_the_collectives_sequence_number_and_is_no_collective():
    """torch's flight recorder gives a send or recv the collective_seq_id of the last collective enqueued before it
    (p2p ops count in p2p_seq_id): the entry of #4 is the all-gather, not the send that follows it."""
    gather = entry("tp", 4, "started", op="nccl:all_gather", pg_id=11)
    send = entry("tp", 4, "started", op="nccl:send", pg_id=11) | {"is_p2p": True, "p2p_seq_id": 1}
    record = {"pg_config": {"tp": {"ranks": "[2, 3]"}}, "entries": [gather, send]}
    record["pg_status"] = {"11": {"last_enqueued_collective": 4, "last_completed_collective": 3}}

    assert hang_collectives.group_records(record)["tp"]["entries"] == {4: gather}


def test_the_step_records_pace_is_the_time_since_its_last_step_however_short():
    record = {"step": 30, "time": 1000.0, "longest_step_s": 0.05}

    seen = hang_report.pace({}, record, 1000.3)

    assert (seen.step, seen.since_s, seen.longest_step_s) == (30, pytest.approx(0.3), 0.05)


def test_exactly_three_ranks_or_groups_are_all_named_with_no_more_to_count():
    here = socket.gethostname()
    never = {n: Rank(n, f"node{n}", answer={"distributed": False}, frames=[f"f{n} (a.py:{n})"]) for n in range(3)}
    assert hang_report.summary(never, [], "why", Path("/r"))[1] == (
        "srun.sh:   never joined: rank 0 on node0: at f0 (a.py:0); rank 1 on node1: at f1 (a.py:1); rank 2 on node2:"
        " at f2 (a.py:2)"
    )
    silent = {n: Rank(n, f"node{n}", registered={"pid": n, "start_time": "x"}) for n in range(3)}
    assert here not in {"node0", "node1", "node2"}
    assert hang_report.silent_line(list(silent.values()), silent, here) == (
        "3 rank(s) did not answer: rank 0 on node0 (pid 0): no answer from node node0; rank 1 on node1 (pid 1): no"
        " answer from node node1; rank 2 on node2 (pid 2): no answer from node node2"
    )


def test_a_rank_that_joined_does_not_hide_a_later_one_that_never_did():
    ranks = {
        0: Rank(0, "h", answer={"distributed": True, "last_step": None}, frames=["step (x.py:1)"]),
        1: Rank(1, "h", answer={"distributed": False}, frames=["load (data.py:7)"]),
        2: Rank(2, "h", ended="it had ended, with exit status 1"),
        3: Rank(3, "h", answer={"distributed": False}, frames=["load (data.py:7)"]),
    }

    assert hang_report.start_hang(ranks) == ([], [ranks[1], ranks[3]])


def test_a_rank_outside_the_collective_that_hangs_in_the_teardown_is_placed_at_its_frames():
    frames = [
        "_abort_process_group (/site/torch/distributed/distributed_c10d.py:2101)",
        "_maybe_destroy_process_group (/site/megatron/bridge/training/pretrain.py:282)",
    ]
    rank = Rank(3, "node2", registered={"pid": 103}, answer={"distributed": False, "last_step": 3}, frames=frames)

    assert hang_report.whereabouts(rank, []) == (
        "training ended with an error (its log has it) and it hangs in the teardown, at _abort_process_group"
        " (distributed_c10d.py:2101) from _maybe_destroy_process_group (pretrain.py:282)"
    )


def test_an_ordinary_stop_counts_a_rank_as_answered_by_its_stacks_or_its_answer():
    ranks = {
        0: Rank(0, "h", registered={"pid": 1}, answer={"last_step": 3}),  # its answer; its stacks not read
        1: Rank(1, "h", registered={"pid": 2}, frames=["step (x.py:1)"]),  # its stacks; its answer still being written
        2: Rank(2, "h"),  # never registered
    }
    stop = hang_report.Stop("training was progressing: last step 3, 0.50 s before the stop", "because")

    assert hang_report.summary(ranks, [], "why", Path("/r"), stop)[1] == (
        "srun.sh:   an ordinary stop: 2 of 3 ranks answered; because"
    )


def test_ranks_that_ended_with_different_exit_statuses_are_not_put_together():
    ranks = {n: Rank(n, "h", ended=f"it had ended, with exit status {n}") for n in range(2)}

    assert hang_report.frames_by_rank(ranks) == [
        "  rank 0 on h: it had ended, with exit status 0",
        "  rank 1 on h: it had ended, with exit status 1",
    ]


def test_a_rank_whose_gpu_never_started_it_and_whose_stacks_did_not_come_is_said_to_have_no_stacks():
    started = dump([entry("0", 9, "started")], {"0": (9, 8)}, ranks="[0, 1]")
    queued = dump([entry("0", 8, "completed"), entry("0", 9, "scheduled")], {"0": (9, 8)}, ranks="[0, 1]")
    ranks = ranks_with({0: started, 1: queued})
    ranks[1].frames = []

    found = hang_collectives.collectives(ranks, 2)

    assert hang_report.whereabouts(ranks[1], found) == (
        "its GPU never started it (the work queued before it is stuck), at no stacks"
    )
    assert hang_report.frames_by_rank({1: ranks[1]}) == ["  rank 1 on node1 (pid 101): no stacks"]


@settings(max_examples=40, deadline=None)
@given(
    ranks=st.sets(st.integers(0, 100_000), max_size=40),
    others=st.sets(
        st.from_regex(r"[a-z][a-z0-9_.-]{0,20}", fullmatch=True).filter(
            lambda name: name != "fr" and not name.startswith("answer-rank-")
        ),
        max_size=10,
    ),
)
def test_forgetting_earlier_answers_removes_every_answer_and_record_and_nothing_else(tmp_path_factory, ranks, others):
    hang = tmp_path_factory.mktemp("hang")
    (hang / "fr").mkdir()
    gone = {f"answer-rank-{rank}.json" for rank in ranks} | {f"fr/rank-{rank}" for rank in ranks}
    kept = {f"rank-{rank}.json" for rank in ranks} | {f"stacks-rank-{rank}.txt" for rank in ranks}
    kept |= others
    for name in gone | kept:
        (hang / name).write_text("{}")

    hang_answers.forget_earlier_answers(hang)

    assert {str(path.relative_to(hang)) for path in hang.rglob("*") if path.is_file()} == kept
