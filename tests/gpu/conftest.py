"""The GPU suite: real training through `srun.sh --local`, one python per GPU, as a single-node user runs it.

Each test records what it measured through the `record` fixture; bench/run_gpu_suite.sh turns the records into
RESULTS_DIR/gpu-suite.{json,md}, whose table goes into bench/results/gpu-suite.md.
"""

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from bench import launches
from tests.gpu import megatron_log

REPO = Path(__file__).resolve().parents[2]
# Most tests run 2 ranks, one a GPU, and 1 where only one GPU is lent; those that need a second rank say so.
GPUS = min(2, torch.cuda.device_count())
needs_two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs: what it shows is between two ranks")
RESULTS = Path(os.environ.get("GPU_RESULTS", "/tmp/gpu-results.jsonl"))


@dataclass
class Run:
    """One launch: its exit status, its labelled output, and what the log says about each iteration."""

    returncode: int
    log: str
    wall_s: float
    first_step_s: float | None
    run_dir: Path | None
    losses: dict[int, float] = field(default_factory=dict)
    step_ms: dict[int, float] = field(default_factory=dict)
    peak_mem_gb: float | None = None

    def median_step_ms(self) -> float | None:
        return megatron_log.steady_median(self.step_ms, megatron_log.WARMUP_STEPS)


@dataclass
class Finished:
    """A command that ended within its time limit: its exit status, its output lines, its seconds, and when it ended."""

    returncode: int
    lines: list[str]
    wall_s: float
    ended: float  # time.monotonic() when the command exited


def run_with_time_limit(
    command: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    timeout_s: float,
    on_line: Callable[[str, subprocess.Popen], None] | None = None,
) -> Finished:
    """Run `command` in a session of its own, its stdout and stderr read line by line by a thread (each line also to
    on_line(line, process)). The limit counts from the start, whatever the output does: a launch still running after
    timeout_s is stopped, all its process tree (srun.sh, torchrun in a group of its own, the ranks), and the test fails
    with its tail."""
    lines: list[str] = []
    start = time.monotonic()
    with subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    ) as process:

        def read() -> None:
            for line in process.stdout:
                lines.append(line)
                if on_line is not None:
                    on_line(line, process)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            launches.stop(process)  # as a user's Ctrl-C (srun.sh's hang report), then nothing of its tree is left
            reader.join(timeout=10)
            pytest.fail(f"{command[0]} still ran after {timeout_s} s: it was stopped\n{''.join(lines[-60:])}")
        ended = time.monotonic()
        reader.join(timeout=30)  # the output ends with the launch, unless something it started still holds it
        kill_group(process)
    return Finished(process.returncode, lines, ended - start, ended)


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL to whatever is left of the process group that `process` leads, and wait for `process`."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def parse_log(run: Run) -> Run:
    training = megatron_log.parse(run.log)
    run.losses, run.step_ms, run.peak_mem_gb = training.losses, training.step_ms, training.peak_mem_gb
    return run


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Run]:
    """launch(recipe, *overrides, gpus=GPUS, options=(), env=None, timeout=420) -> Run, via ./srun.sh --local.

    Each launch runs in a fresh directory (its outputs, nsys reports and launch.log stay there)."""

    def run(recipe: str, *overrides: str, gpus: int = GPUS, options=(), env=None, timeout: int = 420) -> Run:
        tmp_path = tmp_path_factory.mktemp("launch")
        output_root = tmp_path / "outputs"
        command = [str(REPO / "srun.sh"), "--local", *options, str(REPO / "recipes" / recipe), *overrides]
        environment = {
            **os.environ,
            "SRUNSH_GPUS_PER_NODE": str(gpus),
            "SRUNSH_OUTPUT_ROOT": str(output_root),
            **(env or {}),
        }
        started = time.monotonic()
        first_step: list[float] = []

        def note_first_step(line: str, _process: subprocess.Popen) -> None:
            if not first_step and megatron_log.ITERATION.search(line):
                first_step.append(time.monotonic() - started)

        finished = run_with_time_limit(
            command, cwd=tmp_path, env=environment, timeout_s=timeout, on_line=note_first_step
        )
        lines = finished.lines
        (tmp_path / "launch.log").write_text("".join(lines))
        run_dirs = sorted(output_root.glob(f"{Path(recipe).stem}/*"))
        return parse_log(
            Run(
                finished.returncode,
                "".join(lines),
                finished.wall_s,
                first_step[0] if first_step else None,
                run_dirs[-1] if run_dirs else None,
            )
        )

    return run


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Callable[..., None]:
    """record(run, **facts): one line of results for this test, written whether the test then passes or fails."""

    def write(run: Run, **facts: object) -> None:
        entry = {
            "test": request.node.name,
            "returncode": run.returncode,
            "wall_s": round(run.wall_s, 1),
            "time_to_first_step_s": None if run.first_step_s is None else round(run.first_step_s, 1),
            "median_step_ms": run.median_step_ms(),
            "peak_mem_gb": run.peak_mem_gb,
            "losses": {str(k): v for k, v in sorted(run.losses.items())},
            **facts,
        }
        with RESULTS.open("a") as results:
            results.write(json.dumps(entry, default=str) + "\n")

    return write


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or (report.when == "setup" and report.failed):
        with RESULTS.open("a") as results:
            results.write(json.dumps({"test": report.nodeid.split("::")[-1], "outcome": report.outcome}) + "\n")


def tail(run: Run, lines: int = 40) -> str:
    return "\n".join(run.log.splitlines()[-lines:])
