"""The VizTracer plugin's cost outside its window, measured in pairs so that a change in the host's load reaches both.

Each round starts two one-GPU runs of the tiny recipe at once, both the upstream launch with the same overrides, one
with --viztracer-plugin tracing steps 11..15, so they differ by the plugin alone; the next round swaps their GPUs.
Their step times after warm-up (without the window and the step after it, which writes the trace) are compared over
the seconds both were training. Needs 2 GPUs. Writes DIR/viztracer-cost.{md,json} after every round.
"""

import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import launches, megatron_log, report

RUNS = ("not_installed", "installed")
PORTS = {"not_installed": 29610, "installed": 29620}
TINY = "recipes/tiny_gpt_pretrain.py"
WINDOW_START, WINDOW_END = 10, 15  # traces steps 11..15
AFTER_WINDOW = WINDOW_END + 1  # forks the child that writes the trace
COLUMNS = ("round", "seconds both trained", "not installed: GPU, steps, median ms")
COLUMNS += ("installed: GPU, steps, median ms", "installed / not", "step after window / median")
WINDOW = (
    "profiling.use_viztracer=true",
    f"profiling.profile_step_start={WINDOW_START}",
    f"profiling.profile_step_end={WINDOW_END}",
    "profiling.profile_ranks=[0]",
)


def commands(steps: int) -> dict[str, list[str]]:
    args = (f"train.train_iters={steps}", *launches.MEASURED)
    return {
        "not_installed": launches.upstream(TINY, *args, gpus=1, port=PORTS["not_installed"]),
        "installed": launches.upstream(TINY, *args, *WINDOW, gpus=1, port=PORTS["installed"], plugin=True),
    }


def gpus_of_round(index: int) -> tuple[str, str]:
    """The GPUs of (not installed, installed): odd rounds swap them, so a faster GPU favours neither."""
    return ("0", "1") if index % 2 == 0 else ("1", "0")


def run_round(index: int, steps: int, runs_dir: Path, timeout_s: float | None) -> dict:
    """Both runs at once, one per GPU, each read back from its TensorBoard events."""
    with ThreadPoolExecutor(len(RUNS)) as pool:
        futures = {
            run: pool.submit(
                launches.run, command, runs_dir / f"{index}-{run}", timeout_s, {"CUDA_VISIBLE_DEVICES": gpu}
            )
            for run, gpu, command in zip(RUNS, gpus_of_round(index), commands(steps).values(), strict=True)
        }
    step_times = {run: launches.scalars(runs_dir / f"{index}-{run}").get(launches.STEP_TIME_S, {}) for run in RUNS}
    pair = compare(step_times)
    for run, gpu in zip(RUNS, gpus_of_round(index), strict=True):
        pair[run] |= {"gpu": gpu, "returncode": futures[run].result().returncode}
    return pair


def counted(run: str, step: int) -> bool:
    """Steps after warm-up; the installed run's also without its window and the step that writes the trace."""
    in_window = WINDOW_START < step <= AFTER_WINDOW
    return step > megatron_log.WARMUP_STEPS and not (run == "installed" and in_window)


def compare(step_times: dict[str, dict[int, tuple[float, float]]]) -> dict:
    """Each run's median step over its counted steps logged while both runs were training, their ratio, and the
    installed run's step after the window. step_times: {run: {step: (wall time, seconds)}}, as TensorBoard has them."""
    walls = {run: [wall for step, (wall, _) in step_times[run].items() if counted(run, step)] for run in RUNS}
    span = (max(min(walls[run]) for run in RUNS), min(max(walls[run]) for run in RUNS)) if all(walls.values()) else None
    pair: dict = {"concurrent_s": round(span[1] - span[0], 1) if span else None}
    for run in RUNS:
        compared = [
            seconds * 1000
            for step, (wall, seconds) in step_times[run].items()
            if counted(run, step) and span and span[0] <= wall <= span[1]
        ]
        median = round(statistics.median(compared), 2) if compared else None
        pair[run] = {"compared_steps": len(compared), "median_ms": median}
    medians = [pair[run]["median_ms"] for run in RUNS]
    pair["installed / not"] = round(medians[1] / medians[0], 4) if all(medians) else None
    after = step_times["installed"].get(AFTER_WINDOW)
    pair["step after window / median"] = round(after[1] * 1000 / medians[1], 2) if after and medians[1] else None
    return pair


def markdown(result: dict) -> str:
    lines = [
        f"# VizTracer plugin outside its window, {result['date']}",
        "",
        f"{result['hardware']}; {result['versions']}.",
        "",
        *report.table(COLUMNS),
    ]
    for index, pair in enumerate(result["rounds"]):
        cells = [f"GPU {pair[run]['gpu']}, {pair[run]['compared_steps']}, {pair[run]['median_ms']}" for run in RUNS]
        ratios = [pair["installed / not"], pair["step after window / median"]]
        lines.append(report.row([index, pair["concurrent_s"], *cells, *ratios]))
    ratios = [pair["installed / not"] for pair in result["rounds"] if pair["installed / not"]]
    lines += ["", f"Installed / not installed: {launches.spread(ratios)}.", ""]
    lines += [f"- {run}: `{' '.join(command)}`" for run, command in result["commands"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = report.parser("bench_viztracer_overhead", __doc__)
    parser.add_argument("--rounds", type=report.positive, default=5, help="pairs of runs, GPUs swapped (default: 5)")
    parser.add_argument("--steps", type=report.positive, default=240, help="training steps per run (default: 240)")
    parser.add_argument("--timeout", type=float, help="seconds one run may take (default: no limit)")
    args = parser.parse_args(argv)
    launches.stop_on_sigterm()
    result = {**launches.result_header("viztracer-cost", 2, commands(args.steps)), "rounds": []}
    launches.fix_dataset_helpers()
    for index in range(args.rounds):
        result["rounds"].append(run_round(index, args.steps, args.out / "viztracer-cost-runs", args.timeout))
        print(f"round {index}:", result["rounds"][-1], flush=True)
        table = report.write(args.out / "viztracer-cost", result, markdown)
    print(table)


if __name__ == "__main__":
    main()
