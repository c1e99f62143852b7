"""viztracer_plugin.py with the real VizTracer and the real Megatron Bridge hooks it wraps, on CPU."""

import dataclasses
import inspect
import json
import os
import signal
import subprocess
import sys
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


def traced_steps(trace: Path) -> int:
    events = json.loads(trace.read_text())["traceEvents"]
    return sum(1 for e in events if e.get("ph") == "X" and e["name"].startswith("train_step ("))


def test_profiled_rank_writes_one_trace_holding_exactly_the_window(tmp_path: Path):
    result = run_loop(tmp_path, 0)
    assert result.returncode == 0, result.stderr
    trace = tmp_path / "traces" / "trace_rank0.json"
    assert sorted(p.name for p in trace.parent.iterdir()) == [trace.name]
    assert traced_steps(trace) == 4  # steps 4 to 7 (start=3, end=7)
    assert "[profiling] rank 0: viztracer window opens before step 4" in result.stdout
    assert "[profiling] rank 0: viztracer window closes after step 7" in result.stdout
    assert f"[profiling] rank 0: viztracer trace written to {trace}" in result.stdout


def test_trace_names_the_training_process_not_its_forked_writer(tmp_path: Path):
    result = run_loop(tmp_path, 0)
    assert result.returncode == 0, result.stderr
    training_pid = int(result.stdout.split("training pid ")[1].split()[0])
    events = json.loads((tmp_path / "traces" / "trace_rank0.json").read_text())["traceEvents"]
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


def test_trace_is_flushed_when_the_rank_is_terminated_inside_the_window(tmp_path: Path):
    result = run_loop(tmp_path, 0, "--term-at", "5")
    assert result.returncode == -signal.SIGTERM
    assert traced_steps(tmp_path / "traces" / "trace_rank0.json") == 2
