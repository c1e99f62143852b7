"""Per-step A/B that holds on a drifting machine: the arms of a plan (launches of a recipe, each with one change) take
turns on the same GPUs, a few steps each, round after round (bench/turns.py), and every ratio of an arm's throughput to
its block's reference's comes with its spread over the rounds. A step counts in the turn in which it was logged (by
the wall times TensorBoard keeps), less the first of the turn (it holds the pause) and --settle more. bench/README.md
says more. A run writes DIR/turns-PLAN.json (the record and the analysis) and DIR/turns-PLAN.md; the arms run in
--runs-dir. tests/test_plans.py checks every plan's arms, on 1 and 2 GPUs, with entrypoint.py --check.
"""

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench import launches, report, turns

SEQUENCE = {launches.TINY: 2048, launches.LLAMA_FP8: 8192}  # the recipes' model.seq_length
TINY_GLOBAL_BATCH = 32  # the tiny recipe's train.global_batch_size
WARMUP_STEPS = 2  # logged steps before an arm's first turn
# An arm is stopped in the middle of its run: on SIGTERM Megatron Bridge ends the step, flushes TensorBoard and exits
# (its data loader workers need the handler too, or their death fails the rank first); with no checkpoint to write.
STOPPABLE = ("train.exit_signal_handler=true", "train.exit_signal_handler_for_dataloader=true", "checkpoint.save=null")
NOTES = {
    "ours": "the shipped recipe, launched by `srun.sh --local`",
    "upstream": "the same, launched by `torchrun bench/upstream_pretrain.py`",
    "seed": "the shipped recipe with another seed: run-to-run noise",
}
CHANGES = {"seed": ("rng.seed=4321",)}  # each arm's one change from "ours"
LOSS_VS_SAMPLES = "lm loss vs samples"  # Megatron Bridge 0.6.2's training_log: the loss at each consumed-sample count
BLOCK_COLUMNS = ("block", "arm", "against", "rounds", "ratio: median", "IQR", "range", "verdict")
BLOCK_COLUMNS += ("loss: mean, max abs gap", "loss")
ARM_COLUMNS = ("arm", "change", "ms/step", "tokens/s/GPU", "steps counted", "exit")


@dataclass(frozen=True)
class Plan:
    recipe: str
    blocks: tuple[tuple[str, ...], ...]  # each block's first arm is the reference of the others
    layers: int | None  # model.num_layers; None: the recipe's
    sequences_per_gpu: int | None  # per step; None: the recipe's global batch
    rounds: int
    turn_steps: int
    note: str


# One H200 holds two 4-layer processes of the Llama 3 8B shape (FP8, micro-batch 2, sequence 8192) side by side,
# about 45-50 GB each (--layers changes it).
PLANS = {
    "tiny": Plan(launches.TINY, (("ours", "upstream", "seed"),), None, None, 10, 8, "ours against upstream"),
    "llama8b-ab": Plan(
        launches.LLAMA_FP8,
        (("ours", "upstream"), ("ours", "seed")),
        layers=4,
        sequences_per_gpu=8,
        rounds=6,
        turn_steps=3,
        note="ours against upstream, and the run-to-run noise",
    ),
}


# ---- the plans' arms ---------------------------------------------------------------------------------------------
def train_iters(plan: Plan, settle: int) -> int:
    """Enough steps for the arm that stays longest, and the same for every arm, so that all share one LR schedule."""
    per_block = plan.rounds * (1 + settle + plan.turn_steps)
    return 2 * (WARMUP_STEPS + per_block * len(plan.blocks)) + 50


def arm_overrides(plan: Plan, name: str, gpus: int, iterations: int) -> tuple[str, ...]:
    shape = (f"model.num_layers={plan.layers}",) if plan.layers else ()
    batch = (f"train.global_batch_size={plan.sequences_per_gpu * gpus}",) if plan.sequences_per_gpu else ()
    change = CHANGES.get(name, ())
    return (*launches.MEASURED, *STOPPABLE, f"train.train_iters={iterations}", *shape, *batch, *change)


def tokens_per_step(plan: Plan, gpus: int) -> int:
    global_batch = plan.sequences_per_gpu * gpus if plan.sequences_per_gpu else TINY_GLOBAL_BATCH
    return global_batch * SEQUENCE[plan.recipe]


def arms(plan: Plan, gpus: int, settle: int) -> dict[str, turns.Arm]:
    names = list(dict.fromkeys(name for block in plan.blocks for name in block))
    iterations, built = train_iters(plan, settle), {}
    for index, name in enumerate(names):
        overrides = arm_overrides(plan, name, gpus, iterations)
        if name == "upstream":
            command = launches.upstream(plan.recipe, *overrides, gpus=gpus, port=29500 + index)
        else:
            command = launches.ours(plan.recipe, *overrides)
        built[name] = turns.Arm(
            name, tuple(command), {"SRUNSH_GPUS_PER_NODE": str(gpus)}, tokens_per_step(plan, gpus), gpus,
            warmup_steps=WARMUP_STEPS, noise_of="ours" if name == "seed" else None, note=NOTES[name],
            recipe=plan.recipe, overrides=overrides,
        )  # fmt: skip
    return built


# ---- what the turns measured -------------------------------------------------------------------------------------
def counted_steps(step_times: dict[int, tuple[float, float]], began: float, ended: float, settle: int) -> list[int]:
    """The steps logged within (began, ended], in order, without the first 1 + settle."""
    return sorted(step for step, (wall, _) in step_times.items() if began < wall <= ended)[1 + settle :]


def spread(values: list[float]) -> dict | None:
    """Median, quartiles (inclusive) and range."""
    if not values:
        return None
    quartiles = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    figures = (statistics.median(values), quartiles[0], quartiles[2], min(values), max(values))
    return {"n": len(values)} | {
        key: round(v, 4) for key, v in zip(("median", "q1", "q3", "min", "max"), figures, strict=True)
    }


def verdict(ratios: dict | None) -> str:
    """Faster or slower only when the interquartile range of the per-round ratios lies wholly on one side of 1."""
    if ratios is None or ratios["n"] < 3:
        return "too few rounds"
    if ratios["q3"] < 1:
        return "slower, outside the spread"
    return "faster, outside the spread" if ratios["q1"] > 1 else "within the spread"


def block_rounds(block: dict, turns: list[dict], throughput: dict[tuple[str, int], float]) -> dict[str, list[float]]:
    """Per round, each other arm's throughput over the reference's (the block's first arm), in rounds where both
    have one. throughput: {(arm, turn index): tokens/s}."""
    reference, *others = block["arms"]
    rows = [
        {"round": turn["round"], "launch": turn["arm"], "tokens_per_s": throughput.get((turn["arm"], index))}
        for index, turn in enumerate(turns)
        if turn["block"] == block["index"]
    ]
    return {arm: launches.per_round(rows, "tokens_per_s", over=(arm, reference)) for arm in others}


def loss_gap(losses: dict[int, float], reference: dict[int, float]) -> dict | None:
    """Mean and largest |loss - reference loss| at the consumed-sample counts both logged."""
    gaps = [abs(losses[samples] - reference[samples]) for samples in sorted(set(losses) & set(reference))]
    if not gaps:
        return None
    return {"points": len(gaps), "mean_abs": round(statistics.mean(gaps), 5), "max_abs": round(max(gaps), 5)}


def loss_agrees(gap: dict | None, noise: dict | None) -> str:
    """Within run-to-run noise: the mean gap to the reference no larger than that of the same recipe with another
    seed (the noise arm) over the same kind of run."""
    if gap is None:
        return "no common points"
    if noise is None:
        return "no noise arm"
    return "within noise" if gap["mean_abs"] <= noise["mean_abs"] else "outside noise"


def arm_figures(step_times: dict[int, tuple[float, float]], counted: list[int], spec: dict) -> dict:
    """One arm's step time and tokens/s/GPU over its counted steps."""
    step_s = statistics.median(step_times[step][1] for step in counted) if counted else None
    step_ms = round(step_s * 1000, 1) if step_s else None
    tokens_per_s = round(spec["tokens_per_step"] / step_s / spec["gpus"]) if step_s else None
    return {"counted_steps": len(counted), "step_ms": step_ms, "tokens_per_s_per_gpu": tokens_per_s}


def turn_figures(record: dict, step_times: dict[str, dict]) -> tuple[dict, dict]:
    """Per turn: its throughput, tokens per step over the median counted step ({(arm, turn index): tokens/s}); per
    arm: its counted steps."""
    throughput: dict[tuple[str, int], float] = {}
    counted: dict[str, list[int]] = {arm: [] for arm in record["arms"]}
    for index, turn in enumerate(record["turns"]):
        arm, times = turn["arm"], step_times[turn["arm"]]
        steps = counted_steps(times, turn["began"], turn["ended"], record["settle"])
        counted[arm] += steps
        if steps:
            median_s = statistics.median(times[step][1] for step in steps)
            throughput[(arm, index)] = record["arms"][arm]["tokens_per_step"] / median_s
    return throughput, counted


def block_figures(block: dict, record: dict, throughput: dict, losses: dict, noise: dict | None) -> dict:
    rounds = block_rounds(block, record["turns"], throughput) if not block.get("skipped") else {}
    gaps = {arm: loss_gap(losses[arm], losses[block["arms"][0]]) for arm in rounds}
    return {
        **block,
        "ratios": rounds,
        "spread": {arm: spread(ratios) for arm, ratios in rounds.items()},
        "verdict": {arm: verdict(spread(ratios)) for arm, ratios in rounds.items()},
        "loss": {arm: {"gap": gap, "agrees": loss_agrees(gap, noise)} for arm, gap in gaps.items()},
    }


def noise_gap(record: dict, losses: dict[str, dict[int, float]]) -> dict | None:
    """The loss gap of the noise arm (the reference recipe with another seed) to its reference, if the call had one."""
    for block in record["blocks"]:
        reference, *others = block["arms"]
        for arm in others:
            if record["arms"][arm].get("noise_of") == reference:
                return loss_gap(losses[arm], losses[reference])
    return None


def analyse(record: dict, found: dict[str, dict]) -> dict:
    """The whole call: per arm, per block, and the noise. found: {arm: launches.scalars(its directory)}."""
    step_times = {arm: found.get(arm, {}).get(launches.STEP_TIME_S, {}) for arm in record["arms"]}
    throughput, counted = turn_figures(record, step_times)
    figures = {arm: arm_figures(step_times[arm], counted[arm], spec) for arm, spec in record["arms"].items()}
    losses = {arm: launches.values(found.get(arm, {}), LOSS_VS_SAMPLES) for arm in record["arms"]}
    noise = noise_gap(record, losses)
    blocks = [block_figures(block, record, throughput, losses, noise) for block in record["blocks"]]
    return {"arms": figures, "blocks": blocks, "loss_noise": noise}


# ---- the command ---------------------------------------------------------------------------------------------------
def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = report.parser("bench_turns", __doc__)
    parser.add_argument("--plan", choices=sorted(PLANS), default="tiny")
    parser.add_argument("--gpus", type=report.positive, default=1, help="GPUs (ranks) of every arm (default: 1)")
    parser.add_argument("--layers", type=report.positive, help="model.num_layers of a Llama plan (default: the plan's)")
    parser.add_argument("--rounds", type=report.positive, help="rounds per block (default: the plan's)")
    parser.add_argument("--turn-steps", type=report.positive, help="counted steps per turn (default: the plan's)")
    parser.add_argument("--settle", type=int, default=1, help="steps left out after the first of a turn (default: 1)")
    parser.add_argument("--budget-s", type=float, help="seconds the plan may take (default: no limit)")
    parser.add_argument("--runs-dir", type=Path, help="where the arms run (default: DIR/turns-PLAN-runs)")
    args = parser.parse_args(argv)
    args.prefix = args.out / f"turns-{args.plan}"
    args.runs_dir = args.runs_dir or args.out / f"turns-{args.plan}-runs"
    if args.settle < 0 or (args.budget_s is not None and args.budget_s <= 0):
        parser.error("--settle is at least 0, --budget-s above 0")
    if args.layers and PLANS[args.plan].recipe == launches.TINY:
        parser.error("--layers is for the Llama plans: the tiny plan keeps its recipe's layers")
    return args


def plan_of(args: argparse.Namespace) -> tuple[Plan, dict[str, turns.Arm], list[turns.Block]]:
    plan = PLANS[args.plan]
    plan = dataclasses.replace(plan, turn_steps=args.turn_steps or plan.turn_steps, layers=args.layers or plan.layers)
    blocks = [turns.Block(arms=block, rounds=args.rounds or plan.rounds) for block in plan.blocks]
    return plan, arms(plan, args.gpus, args.settle), blocks


def block_lines(block: dict) -> list[str]:
    reference = block["arms"][0]
    if block.get("skipped"):
        return [f"| {block['index']} | {', '.join(block['arms'][1:])} | {reference} | skipped: {block['skipped']} |"]
    lines = []
    for arm, stats in block.get("spread", {}).items():
        gap = block["loss"][arm]["gap"] or {}
        cells = [block["index"], arm, reference, stats["n"] if stats else 0]
        if stats:
            cells += [stats["median"], f"{stats['q1']}-{stats['q3']}", f"{stats['min']}-{stats['max']}"]
        else:
            cells += ["-", "-", "-"]
        cells += [block["verdict"][arm], f"{gap.get('mean_abs', '-')}, {gap.get('max_abs', '-')}"]
        lines.append(report.row([*cells, block["loss"][arm]["agrees"]]))
    return lines + ([f"| {block['index']} | | | cut {block['cut']} |"] if block.get("cut") else [])


def arms_table(record: dict, analysis: dict) -> list[str]:
    lines = report.table(ARM_COLUMNS)
    for name, arm in record["arms"].items():
        figures = analysis.get("arms", {}).get(name, {})
        ended = str(arm.get("returncode"))
        if failure := arm.get("failure"):
            ended += f", {failure['why']}: {' / '.join(failure['last_lines'])}"
        cells = [figures.get(key) for key in ("step_ms", "tokens_per_s_per_gpu", "counted_steps")]
        lines.append(report.row([name, arm["note"], *cells, ended]))
    return lines


def markdown(result: dict) -> str:
    record, analysis, plan = result["record"], result.get("analysis") or {}, PLANS[result["plan"]]
    layers = f"{result['layers']} of 32 layers" if result.get("layers") else "the recipe's layers"
    lines = [
        f"# Per-step A/B, plan {result['plan']}, {result['date']}",
        "",
        f"{result['hardware']}, {result['gpus']} GPU(s) an arm; {result['versions']}. {plan.note}; {layers}.",
        f"Arms take turns on the same GPUs; a turn is {1 + record['settle'] + record['turn_steps']} logged steps, the",
        f"first {1 + record['settle']} left out; a round's ratio is an arm's tokens/s over its block's reference's.",
        "",
        *report.table(BLOCK_COLUMNS),
    ]
    for block in analysis.get("blocks", record["blocks"]):
        lines += block_lines(block)
    lines += ["", *arms_table(record, analysis), ""]
    if noise := analysis.get("loss_noise"):
        lines.append(f"Run-to-run loss noise (another seed): mean abs gap {noise['mean_abs']}, max {noise['max_abs']}.")
    lines += ["", *(f"- {name}: `{' '.join(arm['command'])}`" for name, arm in record["arms"].items())]
    return "\n".join(lines) + "\n"


def write(prefix: Path, result: dict, runs_dir: Path) -> str:
    found = {name: launches.scalars(runs_dir / name) for name in result["record"]["arms"]}
    result["analysis"] = analyse(result["record"], found)
    return report.write(prefix, result, markdown)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    launches.stop_on_sigterm()
    plan, built, blocks = plan_of(args)
    commands = {name: list(arm.command) for name, arm in built.items()}
    result = {**launches.result_header(args.plan, args.gpus, commands), "plan": args.plan, "layers": plan.layers}
    args.out.mkdir(parents=True, exist_ok=True)
    launches.fix_dataset_helpers()
    progress = report.json_path(args.prefix)
    runner = turns.Turns(
        built, blocks, plan.turn_steps, args.settle, args.runs_dir,
        deadline=started + args.budget_s if args.budget_s else math.inf,
        on_progress=lambda record: progress.write_text(json.dumps({**result, "record": record}, default=str)),
    )  # fmt: skip
    try:
        runner.run()
    finally:
        if runner.record:  # empty when stopped before the plan started: nothing to report
            result["record"] = runner.record
            print(write(args.prefix, result, args.runs_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
