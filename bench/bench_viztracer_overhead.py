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
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import bench_launch, megatron_log, report

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
    pair = {
        run: bench_launch.finish_case(case, log, started, timeout_s) | {"gpu": gpu}
        for run, (case, log, gpu) in running.items()
    }
    return compare(pair)


def after_warm_up(run: str, step_ms: dict[int, float]) -> list[float]:
    """Step times after warm-up; the installed run's also without its window and the step that writes the trace."""
    if run == "installed":
        return bench_launch.outside_window(step_ms)
    return [ms for step, ms in step_ms.items() if step > megatron_log.WARMUP_STEPS]


def concurrent_span(logged_at: dict[str, dict[int, str]]) -> tuple[str, str] | None:
    """From the later run's first step after warm-up to the earlier run's last step (the log has whole seconds: a
    step or two either side may fall in or out); None if a run logged no step after warm-up."""
    steady = {run: [at for step, at in logged_at[run].items() if step > megatron_log.WARMUP_STEPS] for run in RUNS}
    if not all(steady.values()):
        return None
    return max(min(steady[run]) for run in RUNS), min(max(steady[run]) for run in RUNS)


def logged_within(step_ms: dict[int, float], logged_at: dict[int, str], span: tuple[str, str] | None) -> dict:
    if span is None:
        return {}
    first, last = span
    return {step: ms for step, ms in step_ms.items() if first <= logged_at.get(step, "") <= last}


def compare(pair: dict) -> dict:
    """Add each run's median over its steps in the span both trained, their ratio, and the installed run's step
    after the window.

    Works on a pair read back from PREFIX.json too, where the step numbers are strings."""
    step_ms = {run: {int(step): ms for step, ms in pair[run]["step_ms"].items()} for run in RUNS}
    logged_at = {run: {int(step): at for step, at in pair[run]["logged_at"].items()} for run in RUNS}
    span = concurrent_span(logged_at)
    if span:
        pair["concurrent"] = list(span)
    for run in RUNS:
        compared = after_warm_up(run, logged_within(step_ms[run], logged_at[run], span))
        pair[run]["compared_steps"] = len(compared)
        pair[run]["median_compared_step_ms"] = round(statistics.median(compared), 2) if compared else None
    medians = [pair[run]["median_compared_step_ms"] for run in RUNS]
    pair["installed / not"] = round(medians[1] / medians[0], 4) if all(medians) else None
    after_window = step_ms["installed"].get(bench_launch.AFTER_WINDOW)
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
        "date": report.timestamp(),
        "hardware": bench_launch.hardware(),
        "versions": bench_launch.versions(),
        "rounds": rounds,
        "median_ratio": statistics.median(ratios) if ratios else None,
        "commands": commands(args.steps),
    }
    print(report.write(args.prefix, result, markdown))


if __name__ == "__main__":
    main()
