"""What the launch benchmarks share: the two launches they compare (A: `srun.sh --local`; B: torchrun running
bench/upstream_pretrain.py on the same recipe and overrides), and one launch with every console line timed as it
arrives. Each launch runs in a directory of its own, its working directory and SRUNSH_OUTPUT_ROOT, below which either
launch writes its outputs.
"""

import contextlib
import math
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO

import psutil

from bench import report

REPO = Path(__file__).resolve().parents[1]
TINY = "recipes/tiny_gpt_pretrain.py"
LLAMA_FP8 = "recipes/llama3_8b_h200_fp8cs_pretrain.py"
# Every step's time, model TFLOP/s and memory into TensorBoard; no validation (its steps are not training steps).
# APEX is not installed; without it Megatron refuses to build the output layer with the gradient accumulation fusion
# on, and the upstream launch does not turn it off by itself (entrypoint.py does).
MEASURED = ("logger.log_interval=1", "logger.log_timers_to_tensorboard=true")
MEASURED += ("logger.log_throughput_to_tensorboard=true", "logger.log_memory_to_tensorboard=true")
MEASURED += ("validation.eval_iters=0", "model.gradient_accumulation_fusion=false")
PACKAGES = ("torch", "megatron-core", "megatron-bridge", "transformer-engine")  # in every result
# Megatron Bridge's console line for each logged step (on its last rank): "[YYYY-MM-DD HH:MM:SS] iteration N/ M | ...
# elapsed time per iteration (ms): T | ...".
ITERATION = re.compile(r"iteration\s+(\d+)/\s*\d+.*?elapsed time per iteration \(ms\): ([\d.]+)")


def ours(recipe: str, *overrides: str) -> list[str]:
    return [str(REPO / "srun.sh"), "--local", str(REPO / recipe), *overrides]


def upstream(recipe: str, *overrides: str, gpus: int, port: int = 29500) -> list[str]:
    run = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={gpus}", f"--master-port={port}"]
    return [*run, str(REPO / "bench" / "upstream_pretrain.py"), str(REPO / recipe), *overrides]


def ab_rounds(rounds: int) -> list[tuple[int, str]]:
    """(round, launch) in the order they run: A B, then B A, and so on, so that neither launch always goes first."""
    return [(index, launch) for index in range(rounds) for launch in ("AB" if index % 2 == 0 else "BA")]


def per_round(runs: list[dict], key: str, over: tuple[str, str] = ("A", "B")) -> list[float]:
    """runs[...][key] of the first launch named in `over` divided by the second's, for each round where both have it."""
    by_round: dict[int, dict[str, float]] = {}
    for row in runs:
        if row.get(key) and row["round"] is not None:
            by_round.setdefault(row["round"], {})[row["launch"]] = row[key]
    top, bottom = over
    pairs = [pair for _, pair in sorted(by_round.items()) if top in pair and bottom in pair]
    return [round(pair[top] / pair[bottom], 4) for pair in pairs]


def spread(ratios: list[float]) -> str:
    if not ratios:
        return "none (no round where both launches got there)"
    return f"median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)}"


@dataclass
class Finished:
    returncode: int | str  # the launcher's exit status, or "timeout N s"
    wall_s: float
    lines: list[tuple[float, str]]  # every console line, with the seconds after the start at which it arrived
    left_behind: list[str] = field(default_factory=list)  # processes of the launch still running after it, by name


class Launch:
    """One launch in flight in `directory`: its console lines, each with the seconds after the start at which it
    arrived. close() writes the console to console.log there."""

    def __init__(self, command: list[str], directory: Path, env: dict[str, str] | None = None) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        # Unbuffered, so that each line arrives when it is printed; every process of the launch inherits its root.
        environment = {**os.environ, "SRUNSH_OUTPUT_ROOT": str(directory / "outputs"), "PYTHONUNBUFFERED": "1"}
        environment |= env or {}
        self.output_root = environment["SRUNSH_OUTPUT_ROOT"]
        self.started = time.monotonic()
        console = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "errors": "replace"}
        self.process = subprocess.Popen(command, cwd=directory, env=environment, start_new_session=True, **console)
        self.arrived: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self.read, args=(self.process.stdout,), daemon=True).start()
        self.lines: list[tuple[float, str]] = []
        self.output_closed = False

    def read(self, stream: IO[str]) -> None:
        for line in stream:
            self.arrived.put((round(time.monotonic() - self.started, 2), line))
        self.arrived.put(None)

    def receive(self, timeout_s: float) -> str | None:
        """The next console line, waiting up to timeout_s for it; None when none came (or the output has closed)."""
        if self.output_closed:
            return None
        try:
            line = self.arrived.get(timeout=timeout_s) if timeout_s > 0 else self.arrived.get_nowait()
        except queue.Empty:
            return None
        if line is None:
            self.output_closed = True
            return None
        self.lines.append(line)
        return line[1]

    def close(self) -> None:
        (self.directory / "console.log").write_text("".join(f"{at:9.2f}  {text}" for at, text in self.lines))

    def reap_left_behind(self, grace_s: float = 5.0) -> list[str]:
        """The names of the launch's processes that still run grace_s after it ended, each then killed: one left
        behind (a worker pool a rank started, say) would slow every launch after it.
        They are found by their SRUNSH_OUTPUT_ROOT, wherever they were re-parented: no other process has it."""
        names = {}
        for process in psutil.process_iter():
            with contextlib.suppress(psutil.Error):  # gone, a zombie, or another user's
                if process.pid != os.getpid() and process.environ().get("SRUNSH_OUTPUT_ROOT") == self.output_root:
                    names[process] = process.name()
        _, alive = psutil.wait_procs(list(names), timeout=grace_s)
        for process in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        return sorted(names[process] for process in alive)


def run(
    command: list[str],
    directory: Path,
    timeout_s: float | None,
    env: dict[str, str] | None = None,
    each_poll: Callable[[Launch], object] = lambda launch: None,
) -> Finished:
    """Run one launch in `directory` until it exits, or stop it (and every rank) after timeout_s (None: no limit) or
    when the benchmark itself is stopped; then kill what it left running (named in Finished.left_behind). EACH_POLL
    is called with the launch at least once a second while it runs."""
    launch = Launch(command, directory, env)
    deadline = math.inf if timeout_s is None else launch.started + timeout_s
    try:
        while not launch.output_closed:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(command, timeout_s)
            launch.receive(min(deadline - time.monotonic(), 1.0))
            each_poll(launch)
        left = None if timeout_s is None else max(0.0, deadline - time.monotonic())
        returncode: int | str = launch.process.wait(timeout=left)
    except subprocess.TimeoutExpired:
        stop(launch.process)
        returncode = f"timeout {timeout_s:g} s"
    except BaseException:
        stop(launch.process)
        raise
    finally:
        launch.close()
    wall_s = round(time.monotonic() - launch.started, 1)
    return Finished(returncode, wall_s, launch.lines, launch.reap_left_behind())


def stop(launcher: subprocess.Popen) -> None:
    """SIGTERM to the launcher's process group: srun.sh and torchrun pass it on to their ranks, which run in sessions
    of their own (a SIGKILL would leave them on the GPUs). Then wait a minute for the launcher, SIGKILL its group, and
    SIGKILL every process of its tree at the SIGTERM that is still there, such as a data loader worker that a failed
    rank left behind, or torchrun itself when srun.sh did not end."""
    tree = process_tree(launcher.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(launcher.pid, signal.SIGTERM)
    try:
        launcher.wait(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
    for process in tree:  # psutil checks that the pid is still that process
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def process_tree(root: int) -> list[psutil.Process]:
    """root and every process below it (the ranks run in sessions of their own, out of the launcher's group)."""
    try:
        launcher = psutil.Process(root)
        return [launcher, *launcher.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def result_header(case: str, gpus: int, commands: dict[str, list[str]]) -> dict:
    """What every benchmark result starts with: the case, when, on what, with which versions, and the commands."""
    query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
    try:
        gpus_seen = subprocess.run(query, capture_output=True, text=True, check=False).stdout.strip().splitlines()
        hardware = f"{len(gpus_seen)} x {gpus_seen[0]}" if gpus_seen else "no GPU"
    except FileNotFoundError:
        hardware = "no nvidia-smi"
    versions = ", ".join(f"{package} {metadata.version(package)}" for package in PACKAGES)
    header = {"case": case, "date": report.timestamp(), "hardware": hardware, "gpus": gpus, "versions": versions}
    return header | {"commands": commands}


def fix_dataset_helpers() -> None:
    """Like run_gpu_suite.sh: a pip-installed megatron-core needs this once, or rank 0 exits at start-up."""
    fix = ["bash", str(REPO / "tools" / "fix_dataset_helpers.sh")]
    subprocess.run(fix, env={**os.environ, "PYTHON": sys.executable}, check=True)


def stop_on_sigterm() -> None:
    """SIGTERM (`timeout`, a batch system, kill) ends the benchmark through run()'s stop of the launch in flight."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
