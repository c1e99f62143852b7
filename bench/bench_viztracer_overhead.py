"""The VizTracer plugin's cost outside its window, measured in pairs so that run-to-run noise cancels.

Each round starts two one-GPU runs of the tiny recipe at the same time, both torchrun + bench/upstream_pretrain.py
with the same environment: "not installed" as it is, "installed" with --viztracer-plugin (viztracer_plugin.py
installed as entrypoint.py installs it) tracing steps 11..15 (bench_launch.WINDOW). So the two differ by the plugin
alone; srun.sh's launch against the upstream one is bench_launch.py's question. The next round swaps their GPUs.
Each run is read over its steps after warm-up (the installed run's without the window and the step after it) that
were logged while the other run was training too, so that a change in the host's load during a round reaches both.
Prints a table; writes PREFIX.json and PREFIX.md.

    python3 bench/bench_viztracer_overhead.py PREFIX [--rounds 2] [--steps 150] [--timeout 300]
"""

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import bench_launch, megatron_log

RUNS = ("not_installed", "installed")
GPU_PAIR = ("0", "1")
PORTS = {"not_installed": 29610, "installed": 29620}


def commands(steps: int) -> dict[str, list[str]]:
    # No validation during the run: its steps would differ between the two only by chance.
    args = (f"train.train_iters={steps}", "validation.eval_interval=1000", bench_launch.NO_FUSION)
    traced = (*args, "profiling.use_viztracer=true", *bench_launch.WINDOW)
    return {
        "not_installed": bench_launch.upstream(bench_launch.TINY, *args, gpus=1, port=PORTS["not_installed"]),
        "installed": bench_launch.upstream(bench_launch.TINY, *traced, gpus=1, port=PORTS["installed"], plugin=True),
    }


def gpus_of_round(index: int) -> tuple[str, str]:
    """The GPUs of (not installed, installed): odd rounds swap them, so a faster GPU favours neither."""
    return GPU_PAIR if index % 2 == 0 else GPU_PAIR[::-1]


def run_round(index: int, steps: int, logs: Path, timeout_s: int) -> dict:
    """Both runs at once, one per GPU."""
    gpus = gpus_of_round(index)
    started = time.monotonic()
    running = {}
    for run, gpu, command in zip(RUNS, gpus, commands(steps).values(), strict=True):
        env = {"CUDA_VISIBLE_DEVICES": gpu, "GPUS_PER_NODE": "1", "MASTER_PORT": str(PORTS[run])}
        log = logs / f"round{index}_{run}.log"
        running[run] = (bench_launch.start_case(command, log, env), log, gpu)
    pair = {}
    for run, (case, log, gpu) in running.items():
        pair[run] = bench_launch.finish_case(case, log, started, timeout_s) | {"gpu": gpu}
        pair[run]["logged_at"] = megatron_log.parse(log.read_text()).logged_at
    return compare(pair)


def after_warm_up(run: str, step_ms: dict[int, float]) -> list[float]:
    """Step times after warm-up; the installed run's also without its window and the step that writes the trace."""
    if run == "installed":
        return bench_launch.outside_window(step_ms)
    return [ms for step, ms in step_ms.items() if step > megatron_log.WARMUP_STEPS]


def concurrent_steps(pair: dict) -> dict[str, list[float]]:
    """Each run's step times after warm-up, logged between the later run's first step after warm-up and the
    earlier run's last step (the log has whole seconds: a step or two either side may fall in or out)."""
    step_ms = {run: {int(step): ms for step, ms in pair[run]["step_ms"].items()} for run in RUNS}
    logged_at = {run: {int(step): at for step, at in pair[run]["logged_at"].items()} for run in RUNS}
    steady = {run: [at for step, at in logged_at[run].items() if step > megatron_log.WARMUP_STEPS] for run in RUNS}
    if not all(steady.values()):
        return {run: [] for run in RUNS}
    first, last = max(min(steady[run]) for run in RUNS), min(max(steady[run]) for run in RUNS)
    pair["concurrent"] = [first, last]
    return {
        run: after_warm_up(
            run, {step: ms for step, ms in step_ms[run].items() if first <= logged_at[run].get(step, "") <= last}
        )
        for run in RUNS
    }


def compare(pair: dict) -> dict:
    """Add each run's median over its concurrent steps, their ratio, and the installed run's step after the window.

    Works on a pair read back from PREFIX.json too, where the step numbers are strings."""
    compared = concurrent_steps(pair)
    for run in RUNS:
        pair[run]["compared_steps"] = len(compared[run])
        pair[run]["median_compared_step_ms"] = round(statistics.median(compared[run]), 2) if compared[run] else None
    medians = [pair[run]["median_compared_step_ms"] for run in RUNS]
    pair["installed / not"] = round(medians[1] / medians[0], 4) if all(medians) else None
    after_window = {int(step): ms for step, ms in pair["installed"]["step_ms"].items()}.get(bench_launch.AFTER_WINDOW)
    if after_window and medians[1]:
        pair["step after window / installed median"] = round(after_window / medians[1], 2)
    return pair


def markdown(result: dict) -> str:
    lines = [
        f"# VizTracer plugin outside its window, {result['date']}",
        "",
        result["hardware"],
        "",
        "| round | concurrent steps logged | not installed: GPU, steps, median ms | installed: GPU, steps, median ms"
        " | installed / not | step after window |",
        "|---|---|---|---|---|---|",
    ]
    for index, pair in enumerate(result["rounds"]):
        cells = [
            f"GPU {pair[run]['gpu']}, {pair[run]['compared_steps']}, {pair[run]['median_compared_step_ms']}"
            for run in RUNS
        ]
        span = " to ".join(pair.get("concurrent", ["none"]))
        after = pair.get("step after window / installed median")
        lines.append(f"| {index} | {span} | {cells[0]} | {cells[1]} | {pair['installed / not']} | {after}x |")
    lines += ["", f"Median of the rounds' ratios: {result['median_ratio']}", "", "Commands:", ""]
    lines += [f"- {run}: `{' '.join(command)}`" for run, command in result["commands"].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prefix", type=Path)
    parser.add_argument("--rounds", type=int, default=2, help="pairs of runs; each swaps the GPUs (default: 2)")
    parser.add_argument("--steps", type=int, default=150, help="training steps per run (default: 150)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds one round may run (default: 300)")
    args = parser.parse_args()
    bench_launch.fix_dataset_helpers()
    rounds = []
    for index in range(args.rounds):
        rounds.append(run_round(index, args.steps, args.prefix.parent, args.timeout))
        print(f"round {index}:", {k: v for k, v in rounds[-1].items() if not isinstance(v, dict)}, flush=True)
    ratios = [r["installed / not"] for r in rounds if r["installed / not"]]
    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "hardware": bench_launch.hardware(),
        "versions": bench_launch.versions(),
        "rounds": rounds,
        "median_ratio": statistics.median(ratios) if ratios else None,
        "commands": commands(args.steps),
    }
    args.prefix.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.prefix.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
