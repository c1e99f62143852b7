"""The GPU suite: real training through `srun.sh --local`, one python per GPU, as a single-node user runs it.

Each test records what it measured through the `record` fixture; bench/run_gpu_suite.sh turns the records into
RESULTS_DIR/gpu-suite.{json,md}, whose table goes into bench/results/gpu-suite.md.
"""

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench import megatron_log

REPO = Path(__file__).resolve().parents[2]
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


def parse_log(run: Run) -> Run:
    training = megatron_log.parse(run.log)
    run.losses, run.step_ms, run.peak_mem_gb = training.losses, training.step_ms, training.peak_mem_gb
    return run


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Run]:
    """launch(recipe, *overrides, gpus=2, options=(), env=None, timeout=420) -> Run, via ./srun.sh --local.

    Each launch runs in a fresh directory (its outputs, nsys reports and launch.log stay there)."""

    def run(recipe: str, *overrides: str, gpus: int = 2, options=(), env=None, timeout: int = 420) -> Run:
        tmp_path = tmp_path_factory.mktemp("launch")
        output_root = tmp_path / "outputs"
        command = [str(REPO / "srun.sh"), "--local", *options, str(REPO / "recipes" / recipe), *overrides]
        environment = {
            **os.environ,
            "SRUNSH_GPUS_PER_NODE": str(gpus),
            "SRUNSH_OUTPUT_ROOT": str(output_root),
            **(env or {}),
        }
        start = time.monotonic()
        first_step = None
        lines = []
        with subprocess.Popen(
            command, cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as process:
            for line in process.stdout:
                lines.append(line)
                if first_step is None and megatron_log.ITERATION.search(line):
                    first_step = time.monotonic() - start
            process.wait(timeout=timeout)
        (tmp_path / "launch.log").write_text("".join(lines))
        run_dirs = sorted(output_root.glob(f"{Path(recipe).stem}/*"))
        return parse_log(
            Run(
                process.returncode,
                "".join(lines),
                time.monotonic() - start,
                first_step,
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
