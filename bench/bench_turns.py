"""Per-step A/B that holds on a drifting machine: the arms of a plan take turns on the same GPUs, a few steps each,
round after round (bench/turns.py), and every ratio comes with its spread over the rounds (bench/per_step.py). Plans:
bench/plans.py. Run it from the checkout, on a GPU host with the stack.

--dry-run prints the arms and blocks and checks every arm's config with entrypoint.py --check; nothing starts. A
real run runs the plan (with --budget-s, no block or round starts past it; without it, no limit), stops every arm,
and writes DIR/turns-PLAN.json (the record and the analysis) and DIR/turns-PLAN.md (the tables); the arms run in
--runs-dir (default DIR/turns-PLAN-runs).
"""

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

from bench import launches, per_step, plans, report, turns

BLOCK_COLUMNS = ("block", "arm", "against", "rounds", "ratio: median", "IQR", "range", "verdict")
BLOCK_COLUMNS += ("loss: mean, max abs gap", "loss")
ARM_COLUMNS = ("arm", "change", "ms/step", "tokens/s/GPU", "TFLOP/s/GPU logged", "GFLOP/token logged")
ARM_COLUMNS += ("peak GB allocated, reserved", "steps counted", "exit")
ARM_FIGURES = ("step_ms", "tokens_per_s_per_gpu", "logged_tflops_per_gpu", "logged_gflop_per_token")  # per_step's


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = report.parser("bench_turns", __doc__)
    parser.add_argument("--plan", choices=sorted(plans.PLANS), default="tiny")
    parser.add_argument("--gpus", type=report.positive, default=1, help="GPUs (ranks) of every arm (default: 1)")
    parser.add_argument("--layers", type=report.positive, help="model.num_layers of a Llama plan (default: the plan's)")
    parser.add_argument("--rounds", type=report.positive, help="rounds per block (default: the plan's)")
    parser.add_argument("--turn-steps", type=report.positive, help="counted steps per turn (default: the plan's)")
    parser.add_argument("--settle", type=int, default=1, help="steps left out after the first of a turn (default: 1)")
    parser.add_argument("--budget-s", type=float, help="seconds the plan may take (default: no limit)")
    parser.add_argument("--runs-dir", type=Path, help="where the arms run (default: DIR/turns-PLAN-runs)")
    parser.add_argument("--dry-run", action="store_true", help="print and check the plan; start nothing")
    args = parser.parse_args(argv)
    args.prefix = args.out / f"turns-{args.plan}"
    args.runs_dir = args.runs_dir or args.out / f"turns-{args.plan}-runs"
    if args.settle < 0 or (args.budget_s is not None and args.budget_s <= 0):
        parser.error("--settle is at least 0, --budget-s above 0")
    if args.layers and plans.PLANS[args.plan].recipe == plans.TINY:
        parser.error("--layers is for the Llama plans: the tiny plan keeps its recipe's layers")
    return args


def plan_of(args: argparse.Namespace) -> tuple[plans.Plan, dict[str, turns.Arm], list[turns.Block]]:
    plan = plans.PLANS[args.plan]
    plan = dataclasses.replace(plan, turn_steps=args.turn_steps or plan.turn_steps, layers=args.layers or plan.layers)
    arms = plans.arms(plan, args.gpus, args.settle)
    return plan, arms, plans.blocks(plan, args.rounds)


def describe(arms: dict[str, turns.Arm], blocks: list[turns.Block]) -> str:
    lines = [f"block {i}: {' '.join(b.arms)} ({b.rounds} rounds, reference {b.arms[0]})" for i, b in enumerate(blocks)]
    for arm in arms.values():
        env = " ".join(f"{k}={v}" for k, v in arm.env.items())
        lines.append(f"{arm.name} ({arm.note}; warm-up {arm.warmup_steps} steps): env {env}\n  {' '.join(arm.command)}")
    return "\n".join(lines)


def dry_run(args: argparse.Namespace) -> int:
    import entrypoint  # imports Megatron Bridge: only for the dry run

    _, arms, blocks = plan_of(args)
    print(describe(arms, blocks))
    checked = {(arm.recipe, arm.overrides, arm.gpus): arm.name for arm in arms.values()}  # ours and upstream: one
    check = ["--check", "--world-size"]
    refused = [n for (r, o, g), n in checked.items() if entrypoint.main([str(launches.REPO / r), *o, *check, str(g)])]
    print(f"refused by entrypoint.py --check: {', '.join(refused)}" if refused else "every arm's config passes")
    return 2 if refused else 0


def markdown(result: dict) -> str:
    record, analysis, plan = result["record"], result.get("analysis") or {}, plans.PLANS[result["plan"]]
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
        reference = block["arms"][0]
        if block.get("skipped"):
            others = ", ".join(block["arms"][1:])
            lines.append(f"| {block['index']} | {others} | {reference} | skipped: {block['skipped']} |")
            continue
        for arm, stats in block.get("spread", {}).items():
            gap = block["loss"][arm]["gap"] or {}
            cells = [block["index"], arm, reference, stats["n"] if stats else 0]
            if stats:
                cells += [stats["median"], f"{stats['q1']}-{stats['q3']}", f"{stats['min']}-{stats['max']}"]
            else:
                cells += ["-", "-", "-"]
            cells += [block["verdict"][arm], f"{gap.get('mean_abs', '-')}, {gap.get('max_abs', '-')}"]
            cells.append(block["loss"][arm]["agrees"])
            lines.append(report.row(cells))
        if block.get("cut"):
            lines.append(f"| {block['index']} | | | cut {block['cut']} |")
    lines += ["", *arms_table(record, analysis), ""]
    if noise := analysis.get("loss_noise"):
        lines.append(f"Run-to-run loss noise (another seed): mean abs gap {noise['mean_abs']}, max {noise['max_abs']}.")
    lines += ["", *(f"- {name}: `{' '.join(arm['command'])}`" for name, arm in record["arms"].items())]
    return "\n".join(lines) + "\n"


def arms_table(record: dict, analysis: dict) -> list[str]:
    lines = report.table(ARM_COLUMNS)
    for name, arm in record["arms"].items():
        figures = analysis.get("arms", {}).get(name, {})
        ended = str(arm.get("returncode"))
        if failure := arm.get("failure"):
            ended += f", {failure['why']}: {' / '.join(failure['last_lines'])}"
        memory = f"{figures.get('peak_allocated_gb')}, {figures.get('peak_reserved_gb')}"
        cells = [figures.get(key) for key in ARM_FIGURES]
        lines.append(report.row([name, arm["note"], *cells, memory, figures.get("counted_steps"), ended]))
    return lines


def write(prefix: Path, result: dict, runs_dir: Path) -> str:
    found = {name: launches.scalars(runs_dir / name) for name in result["record"]["arms"]}
    result["analysis"] = per_step.analyse(result["record"], found)
    return report.write(prefix, result, markdown)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    started = time.monotonic()
    launches.stop_on_sigterm()
    plan, arms, blocks = plan_of(args)
    commands = {name: list(arm.command) for name, arm in arms.items()}
    result = {**launches.result_header(args.plan, args.gpus, commands), "plan": args.plan, "layers": plan.layers}
    args.out.mkdir(parents=True, exist_ok=True)
    launches.fix_dataset_helpers()
    progress = report.json_path(args.prefix)
    runner = turns.Turns(
        arms,
        blocks,
        plan.turn_steps,
        args.settle,
        args.runs_dir,
        deadline=started + args.budget_s if args.budget_s else math.inf,
        on_progress=lambda record: progress.write_text(json.dumps({**result, "record": record}, default=str)),
    )
    try:
        runner.run()
    finally:
        if runner.record:  # empty when stopped before the plan started: nothing to report
            result["record"] = runner.record
            print(write(args.prefix, result, args.runs_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
