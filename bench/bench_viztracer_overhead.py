"""The VizTracer plugin's cost outside its window, measured in pairs so that run-to-run noise cancels.

Each round starts two one-GPU runs of the tiny recipe at the same time: "not installed" is the upstream launch
(torchrun + bench/upstream_pretrain.py: no entrypoint, no plugin), "installed" is `srun.sh --local` with the plugin
tracing steps 11..15 (bench_launch.WINDOW). The next round swaps their GPUs. Both runs are read over the same steps:
after warm-up, leaving out the window and the step after it. Prints a table; writes PREFIX.json and PREFIX.md.

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

from bench import bench_launch

RUNS = ("not_installed", "installed")
GPU_PAIR = ("0", "1")
PORTS = {"not_installed": 29610, "installed": 29620}


def commands(steps: int) -> dict[str, list[str]]:
    # No validation during the run: its steps would differ between the two only by chance.
    args = (f"train.train_iters={steps}", "validation.eval_interval=1000", bench_launch.NO_FUSION)
    traced = (*args, "profiling.use_viztracer=true", *bench_launch.WINDOW)
    return {
        "not_installed": bench_launch.upstream(bench_launch.TINY, *args, gpus=1, port=PORTS["not_installed"]),
        "installed": bench_launch.ours(bench_launch.TINY, *traced),
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
    pair = {
        run: bench_launch.finish_case(case, log, started, timeout_s) | {"gpu": gpu}
        for run, (case, log, gpu) in running.items()
    }
    return compare(pair)


def compare(pair: dict) -> dict:
    """Add each run's median over the compared steps, their ratio, and the installed run's step after the window.

    Works on a pair read back from PREFIX.json too, where the step numbers are strings."""
    steps = {run: {int(step): ms for step, ms in pair[run]["step_ms"].items()} for run in RUNS}
    for run in RUNS:
        compared = bench_launch.outside_window(steps[run])
        pair[run]["median_compared_step_ms"] = round(statistics.median(compared), 2) if compared else None
    medians = [pair[run]["median_compared_step_ms"] for run in RUNS]
    pair["installed / not"] = round(medians[1] / medians[0], 4) if all(medians) else None
    after_window = steps["installed"].get(bench_launch.AFTER_WINDOW)
    if after_window and medians[1]:
        pair["step after window / installed median"] = round(after_window / medians[1], 2)
    return pair


def markdown(result: dict) -> str:
    lines = [
        f"# VizTracer plugin outside its window, {result['date']}",
        "",
        result["hardware"],
        "",
        "| round | not installed: GPU, median ms | installed: GPU, median ms | installed / not | step after window |",
        "|---|---|---|---|---|",
    ]
    for index, pair in enumerate(result["rounds"]):
        cells = [f"GPU {pair[run]['gpu']}, {pair[run]['median_compared_step_ms']}" for run in RUNS]
        after = pair.get("step after window / installed median")
        lines.append(f"| {index} | {cells[0]} | {cells[1]} | {pair['installed / not']} | {after}x |")
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
