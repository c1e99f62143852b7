"""Throughput of our launch (A: srun.sh --local) against the upstream launch (B: torchrun + bench/upstream_pretrain.py)
on the same recipe and overrides, from the TensorBoard event files Megatron Bridge writes in each run.

    python3 bench/bench_launch.py PREFIX [--case llama3_8b_h200_fp8cs|tiny] [--gpus 2] [--rounds 2] [NAME=VALUE ...]

Rounds run A B, then B A, and so on. A run's step time is the median of "iteration-time" after the warm-up steps, its
model TFLOP/s/GPU the median of "throughput/tflops/device", its peak memory the largest
"memory/mem-max-allocated-gigabytes"; tokens/s/GPU = the case's tokens per step / step time / GPUs. A round's ratio is
A's throughput over B's (B's step time over A's). NAME=VALUE go to both launches, e.g. model.num_layers=4 to fit the
Llama case on one GPU. Prints a table; writes PREFIX.md and PREFIX.json after every run.
"""

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.*, as the GPU suite imports them

from bench import launches, report
from bench.launches import PEAK_ALLOCATED_GB, STEP_TIME_S, TFLOPS_PER_GPU


@dataclass(frozen=True)
class Case:
    recipe: str
    overrides: tuple[str, ...]
    tokens_per_step: int  # global batch x sequence length, as the overrides and the recipe set them


CASES = {
    "llama3_8b_h200_fp8cs": Case(
        "recipes/llama3_8b_h200_fp8cs_pretrain.py",
        ("train.global_batch_size=16", "train.train_iters=7"),
        tokens_per_step=16 * 8192,
    ),
    "tiny": Case("recipes/tiny_gpt_pretrain.py", ("train.train_iters=40",), tokens_per_step=32 * 2048),
}


def commands(case: Case, gpus: int, extra: list[str]) -> dict[str, list[str]]:
    overrides = (*case.overrides, *launches.MEASURED, *extra)
    return {"A": launches.ours(case.recipe, *overrides), "B": launches.upstream(case.recipe, *overrides, gpus=gpus)}


def throughput(found: dict, tokens_per_step: int, gpus: int) -> dict:
    """One run's figures from its TensorBoard scalars (see launches.scalars)."""
    step_s = launches.steady_median(launches.values(found, STEP_TIME_S))
    tflops = launches.steady_median(launches.values(found, TFLOPS_PER_GPU))
    peak = launches.values(found, PEAK_ALLOCATED_GB).values()
    return {
        "steps": len(found.get(STEP_TIME_S, {})),
        "step_ms": round(step_s * 1000, 1) if step_s else None,
        "tflops_per_gpu": round(tflops, 1) if tflops else None,
        "tokens_per_s_per_gpu": round(tokens_per_step / step_s / gpus) if step_s else None,
        "peak_allocated_gb": max(peak, default=None),
    }


COLUMNS = ("round", "launch", "returncode", "wall_s", "steps", "step_ms", "tflops_per_gpu", "tokens_per_s_per_gpu")


def markdown(result: dict) -> str:
    lines = [
        f"# Launch throughput A/B, {result['case']}, {result['date']}",
        "",
        f"{result['hardware']}, {result['gpus']} GPU(s); {result['versions']}.",
        "",
        "| " + " | ".join((*COLUMNS, "peak_allocated_gb")) + " |",
        "|" + "---|" * (len(COLUMNS) + 1),
    ]
    for row in result["runs"]:
        lines.append("| " + " | ".join(str(row.get(column)) for column in (*COLUMNS, "peak_allocated_gb")) + " |")
    ratios = result["throughput_a_over_b"]
    lines += ["", f"A/B throughput per round: {', '.join(map(str, ratios)) or '-'}; {launches.spread(ratios)}."]
    lines += ["", *(f"- {launch}: `{' '.join(command)}`" for launch, command in result["commands"].items())]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prefix", type=Path)
    parser.add_argument("overrides", nargs="*", metavar="NAME=VALUE", help="more overrides, for both launches")
    parser.add_argument("--case", choices=sorted(CASES), default="llama3_8b_h200_fp8cs")
    parser.add_argument("--gpus", type=int, default=2, help="GPUs (ranks) per launch (default: 2)")
    parser.add_argument("--rounds", type=int, default=2, help="A B, then B A, ... (default: 2)")
    parser.add_argument("--timeout", type=float, default=400, help="seconds one launch may run (default: 400)")
    args = parser.parse_intermixed_args()
    launches.stop_on_sigterm()
    case = CASES[args.case]
    header = launches.result_header(args.case, args.gpus, commands(case, args.gpus, args.overrides))
    result = {**header, "runs": [], "throughput_a_over_b": []}
    launches.fix_dataset_helpers()
    for index, (round_index, launch) in enumerate(launches.ab_rounds(args.rounds)):
        directory = args.prefix.parent / f"{args.prefix.name}-runs" / f"{index}-{launch}"
        env = {"SRUNSH_GPUS_PER_NODE": str(args.gpus)}
        finished = launches.run(result["commands"][launch], directory, args.timeout, env)
        row = {"round": round_index, "launch": launch, "returncode": finished.returncode, "wall_s": finished.wall_s}
        result["runs"].append(row | throughput(launches.scalars(directory), case.tokens_per_step, args.gpus))
        result["throughput_a_over_b"] = launches.per_round(result["runs"], "step_ms", over=("B", "A"))
        print(result["runs"][-1], flush=True)
        table = report.write(args.prefix, result, markdown)
    print(table)


if __name__ == "__main__":
    main()
