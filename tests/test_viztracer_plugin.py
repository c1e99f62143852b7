"""viztracer_plugin.py with the real VizTracer and the real Megatron Bridge hooks it wraps, on CPU."""

import dataclasses
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import megatron.bridge.training.profiling as upstream_profiling
import megatron.bridge.training.train as upstream_train
import pytest
from megatron.bridge.training.config import ProfilingConfig

import viztracer_plugin
from tests.conftest import REPO

LOOP = REPO / "tests" / "fixtures" / "training_loop.py"
UPSTREAM_SIGNATURES = {
    "handle_profiling_step": ["config", "iteration", "rank", "pytorch_prof"],
    "handle_profiling_stop": ["config", "iteration", "rank", "pytorch_prof", "nsys_nvtx_context"],
}


@pytest.mark.parametrize("name", viztracer_plugin.PATCHED)
def test_upstream_hooks_the_plugin_wraps_keep_their_names_and_signatures(name: str):
    """Fails when megatron-bridge renames or re-signs the functions the plugin wraps (0.6.2: profiling.py)."""
    upstream = getattr(upstream_profiling, name)
    assert list(inspect.signature(upstream).parameters) == UPSTREAM_SIGNATURES[name]
    in_train = getattr(upstream_train, name)
    assert getattr(in_train, "__wrapped__", in_train) is upstream, f"train.py no longer calls profiling.{name}"


def test_use_viztracer_is_a_real_dataclass_field_of_a_profiling_config():
    field = {f.name: f for f in dataclasses.fields(viztracer_plugin.VizTracerProfilingConfig)}["use_viztracer"]
    assert field.default is False
    assert issubclass(viztracer_plugin.VizTracerProfilingConfig, ProfilingConfig)


def test_viztracer_with_nsys_is_refused_at_finalize():
    config = viztracer_plugin.VizTracerProfilingConfig(use_viztracer=True, use_nsys_profiler=True)
    with pytest.raises(ValueError, match="enable one profiler per run"):
        config.finalize()


def test_install_wraps_each_hook_once():
    viztracer_plugin.install()
    first = upstream_train.handle_profiling_step
    viztracer_plugin.install()
    assert upstream_train.handle_profiling_step is first
    assert first.__wrapped__ is upstream_profiling.handle_profiling_step
    assert upstream_train.handle_profiling_stop.__wrapped__ is upstream_profiling.handle_profiling_stop


def run_loop(tmp_path: Path, rank: int, *extra: str, ranks: str = "0") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VIZTRACER_OUTPUT_DIR": str(tmp_path / "traces")}
    return subprocess.run(
        [sys.executable, str(LOOP), str(rank), "12", "3", "7", ranks, *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


@pytest.fixture
def rank_0_run(once, tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """rank 0 of the loop as run_loop runs it, and its traces folder: one run a session for the tests that read it."""

    def run() -> tuple[subprocess.CompletedProcess[str], Path]:
        folder = tmp_path_factory.mktemp("rank_0_run")
        return run_loop(folder, 0), folder / "traces"

    return once("viztracer-rank-0", run)


def traced_steps(trace: Path) -> int:
    events = json.loads(trace.read_text())["traceEvents"]
    return sum(1 for e in events if e.get("ph") == "X" and e["name"].startswith("train_step ("))


def test_profiled_rank_writes_one_trace_holding_exactly_the_window(rank_0_run):
    result, traces = rank_0_run
    assert result.returncode == 0, result.stderr
    trace = traces / "trace_rank0.json"
    assert sorted(p.name for p in trace.parent.iterdir()) == [trace.name]
    assert traced_steps(trace) == 4  # steps 4 to 7 (start=3, end=7)
    assert "[profiling] rank 0: viztracer window opens before step 4" in result.stdout
    assert "[profiling] rank 0: viztracer window closes after step 7" in result.stdout
    assert f"[profiling] rank 0: viztracer trace written to {trace}" in result.stdout


def test_trace_names_the_training_process_not_its_forked_writer(rank_0_run):
    result, traces = rank_0_run
    assert result.returncode == 0, result.stderr
    training_pid = int(result.stdout.split("training pid ")[1].split()[0])
    events = json.loads((traces / "trace_rank0.json").read_text())["traceEvents"]
    assert {e["pid"] for e in events if e.get("ph") == "X"} == {training_pid}


def test_failed_trace_writer_is_reported_and_training_goes_on(tmp_path: Path):
    (tmp_path / "traces" / "trace_rank0.json").mkdir(parents=True)  # the writer cannot open a directory as its file
    result = run_loop(tmp_path, 0)
    assert result.returncode == 0, result.stderr
    trace = tmp_path / "traces" / "trace_rank0.json"
    assert f"Can't open file {trace} to write" in result.stderr  # VizTracer's error, printed by the writer
    assert f"[profiling] rank 0: viztracer failed to write {trace} (see its error above)" in result.stdout
    # The writer ended where it was forked: it did not go on running the training loop as a second rank 0.
    assert result.stdout.count("training pid") == 1
    assert result.stdout.count("viztracer window closes") == 1


def test_rank_outside_profile_ranks_writes_nothing(tmp_path: Path):
    result = run_loop(tmp_path, 1)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "traces").exists()
    assert "[profiling]" not in result.stdout


def test_empty_profile_ranks_traces_every_rank(tmp_path: Path):
    result = run_loop(tmp_path, 3, ranks="")
    assert result.returncode == 0, result.stderr
    assert traced_steps(tmp_path / "traces" / "trace_rank3.json") == 4


def test_trace_is_flushed_when_training_fails_inside_the_window(tmp_path: Path):
    result = run_loop(tmp_path, 0, "--die-at", "5")
    assert result.returncode == 1
    assert "training failed at step 5" in result.stderr
    assert traced_steps(tmp_path / "traces" / "trace_rank0.json") == 2  # steps 4 and 5 ran before the failure


@contextmanager
def rank_session(tmp_path: Path, *args: str) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """training_loop.py in a session of its own, as srun.sh starts a rank (setsid), so its process group holds what
    it forks (DataLoader workers, the trace writer); the group is killed when the test ends. Yields the process and
    the file holding its stdout and stderr."""
    log = tmp_path / "rank.log"
    env = {**os.environ, "VIZTRACER_OUTPUT_DIR": str(tmp_path / "traces")}
    with log.open("wb") as sink:
        rank = subprocess.Popen(
            [sys.executable, str(LOOP), *args], stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        yield rank, log
    finally:
        with suppress(ProcessLookupError):  # nothing of the group left
            os.killpg(rank.pid, signal.SIGKILL)
        rank.wait()


def wait_until_printed(log: Path, text: str, rank: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        ended = rank.poll() is not None and text not in log.read_text()
        assert not ended, f"rank ended before printing {text!r}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"rank printed no {text!r} in {timeout_s:g} s:\n{log.read_text()}"
        time.sleep(0.05)


def exit_status(rank: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """The rank's exit status, or None if it still runs after timeout_s."""
    with suppress(subprocess.TimeoutExpired):
        return rank.wait(timeout=timeout_s)
    return None


def sigterm_to_the_rank_after(tmp_path: Path, printed: str, *args: str) -> tuple[int | None, str]:
    """The training loop with ARGS, stopped as a job is once it printed PRINTED: SIGTERM to its whole process group.
    Its exit status within 60 s (None: still running) and its output."""
    with rank_session(tmp_path, *args) as (rank, log):
        wait_until_printed(log, printed, rank)
        os.killpg(rank.pid, signal.SIGTERM)
        status = exit_status(rank, 60)
    return status, log.read_text()


def test_trace_holds_the_window_up_to_a_sigterm_sent_to_the_whole_rank(tmp_path: Path):
    """Stopped as srun.sh and slurmstepd stop a job: SIGTERM to every process of the rank, its DataLoader workers
    included (Megatron Bridge's recipes use 2), while the main thread is inside the training loop."""
    args = ("0", "1000", "3", "400", "0", "--loader-workers", "2", "--step-s", "0.05")
    status, output = sigterm_to_the_rank_after(tmp_path, "step 8 done\n", *args)
    assert status == -signal.SIGTERM, output
    trace = tmp_path / "traces" / "trace_rank0.json"
    assert f"[profiling] rank 0: viztracer trace written to {trace}" in output
    done = max(int(step) for step in re.findall(r"^step (\d+) done$", output, re.MULTILINE))
    # Steps 4 to `done`, and the step the signal fell in if it ended before its line was printed.
    assert traced_steps(trace) in (done - 3, done - 2)


def test_trace_is_written_when_native_code_reset_sigterm_inside_the_window(tmp_path: Path):
    """On the H200 a native library set SIGTERM back to its default action inside the window while Python still named
    the window's handler, and the stopped rank died with no trace. The reset comes a step before the signal."""
    args = ("0", "1000", "3", "400", "0", "--native-sigterm-reset-at", "7", "--step-s", "0.05")
    status, output = sigterm_to_the_rank_after(tmp_path, "step 9 done\n", *args)
    assert "SIGTERM reset in native code" in output
    assert status == -signal.SIGTERM, output
    trace = tmp_path / "traces" / "trace_rank0.json"
    assert f"[profiling] rank 0: viztracer trace written to {trace}" in output, output
    assert traced_steps(trace) >= 6


def test_rank_waiting_in_native_code_after_its_window_dies_of_sigterm(tmp_path: Path):
    """A Python signal handler runs only when the interpreter gets control back: left installed after the window, it
    would keep a rank stuck in native code (an NCCL wait in a hung job) alive through SIGTERM."""
    args = ("0", "200", "3", "7", "0", "--step-s", "0.02", "--hang-at", "150")
    with rank_session(tmp_path, *args) as (rank, log):
        wait_until_printed(log, "waiting in native code\n", rank)
        assert "[profiling] rank 0: viztracer trace written to" in log.read_text(), "the test needs the writer done"
        os.killpg(rank.pid, signal.SIGTERM)
        status = exit_status(rank, 10)
    assert status == -signal.SIGTERM, f"exit status {status} 10 s after SIGTERM (None: still running)"


def test_rank_stops_a_stuck_trace_writer_and_exits(tmp_path: Path):
    trace = tmp_path / "traces" / "trace_rank0.json"
    trace.parent.mkdir()
    os.mkfifo(trace)  # nobody reads it: the writer blocks opening it, as on a hung file system
    with rank_session(tmp_path, "0", "12", "3", "7", "0", "--writer-deadline", "1") as (rank, log):
        # The clock starts once the window has closed and the writer is stuck, not at the start: the imports before
        # step 1 took over 30 s on a loaded 2-core machine.
        wait_until_printed(log, "step 7 done\n", rank, timeout_s=600)
        status = exit_status(rank, 30)
    output = log.read_text()
    assert status == 0, f"exit status {status} (None: still running after 30 s)\n{output}"
    assert (
        f"[profiling] rank 0: viztracer writer did not finish writing {trace} within 1 s; stopped it, the trace is"
        " missing or incomplete"
    ) in output


def test_trace_writer_lives_through_a_sigterm_to_the_whole_rank(tmp_path: Path):
    """The writer is in the rank's process group, which a stopped job signals as a whole: it finishes the trace, and
    the rank waits for it before it ends."""
    trace = tmp_path / "traces" / "trace_rank0.json"
    trace.parent.mkdir()
    os.mkfifo(trace)  # holds the writer before it writes, until the test reads
    with rank_session(tmp_path, "0", "100000", "3", "7", "0", "--step-s", "0.02") as (rank, log):
        wait_until_printed(log, "viztracer window closes after step 7", rank)
        os.killpg(rank.pid, signal.SIGTERM)
        with trace.open() as reader:
            text = reader.read()
        status = exit_status(rank, 60)
    output = log.read_text()
    assert status == -signal.SIGTERM, output
    # Counted in the text: VizTracer's writer seeks back over its last comma, which a FIFO cannot, so this is no JSON.
    assert len(re.findall(r'"ph":"X",[^}]*"name":"train_step \(', text)) == 4
    assert f"[profiling] rank 0: viztracer trace written to {trace}" in output
