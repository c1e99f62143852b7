"""Per-step A/B that holds on a drifting machine: the arms of a plan take turns on the same GPUs, a few steps each,
round after round (bench/turns.py), and every ratio comes with its spread over the rounds and the machine's drift over
the call (bench/per_step.py). Cases and plans: bench/levers.py. From the checkout, on a GPU host with the stack:

    python3 -m bench.bench_turns --plan PLAN --out DIR [--gpus 1] [--layers N] [--rounds N] [--turn-steps N]
        [--settle N] [--budget-s S] [--runs-dir DIR] [--dry-run | --report]

--dry-run prints the arms and blocks and checks every arm's config as entrypoint.py --check does (the real Megatron
Bridge classes), with the overrides Megatron Bridge undoes and the FLOPs per token by each formula; nothing starts.
A real run checks the same in a second process while the first arms start, runs the plan (with --budget-s, no block
or round starts past it; without it, no limit), stops every arm, and writes DIR/turns-PLAN.json (the record and the
analysis) and DIR/turns-PLAN.md (the tables); the arms run in --runs-dir (default DIR/turns-PLAN-runs). --report
writes the report again from DIR/turns-PLAN.json and the runs.
"""

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from bench import launches, levers, per_step, report, turns

SETTLE = 1
BLOCK_COLUMNS = ("block", "arm", "against", "rounds", "ratio: median", "IQR", "range", "verdict")
BLOCK_COLUMNS += ("loss: mean, max abs gap", "loss")
ARM_COLUMNS = ("arm", "change", "ms/step", "tokens/s/GPU", "TFLOP/s/GPU logged", "GFLOP/token logged")
ARM_COLUMNS += ("TFLOP/s/GPU by Megatron Bridge's formula, 6N, 6N + attention", "peak GB allocated, reserved")
ARM_COLUMNS += ("steps counted", "first counted / rest", "exit")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = report.parser("bench_turns", __doc__)
    parser.add_argument("--plan", choices=sorted(levers.PLANS), default="tiny")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs (ranks) of every arm (default: 1)")
    parser.add_argument("--layers", type=int, help="model.num_layers of a Llama plan (default: the plan's)")
    parser.add_argument("--rounds", type=int, help="rounds per block (default: the plan's)")
    parser.add_argument("--turn-steps", type=int, help="counted steps per turn (default: the plan's)")
    parser.add_argument("--settle", type=int, default=SETTLE, help="steps left out after the first of a turn")
    parser.add_argument("--budget-s", type=float, help="seconds the plan may take (default: no limit)")
    parser.add_argument("--runs-dir", type=Path, help="where the arms run (default: DIR/turns-PLAN-runs)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print and check the plan; start nothing")
    mode.add_argument("--report", action="store_true", help="write the report again from PREFIX.json")
    args = parser.parse_args(argv)
    args.prefix = args.out / f"turns-{args.plan}"
    args.runs_dir = args.runs_dir or args.out / f"turns-{args.plan}-runs"
    counts = [args.gpus, *(n for n in (args.layers, args.rounds, args.turn_steps) if n is not None)]
    if min(counts) < 1 or args.settle < 0 or (args.budget_s is not None and args.budget_s <= 0):
        parser.error("--gpus, --layers, --rounds, --turn-steps are at least 1, --settle at least 0, --budget-s above 0")
    if args.layers and levers.PLANS[args.plan].recipe == levers.TINY:
        parser.error("--layers is for the Llama plans: the tiny plan keeps its recipe's layers")
    return args


def plan_of(args: argparse.Namespace) -> tuple[levers.Plan, dict[str, turns.Arm], list[turns.Block]]:
    plan = levers.PLANS[args.plan]
    plan = dataclasses.replace(plan, turn_steps=args.turn_steps or plan.turn_steps, layers=args.layers or plan.layers)
    arms = levers.arms(plan, args.gpus, args.settle)
    blocks = levers.blocks(plan, args.rounds)
    turns.check_plan(arms, blocks)
    return plan, arms, blocks


def describe(arms: dict[str, turns.Arm], blocks: list[turns.Block]) -> str:
    lines = [f"block {i}: {' '.join(b.arms)} ({b.rounds} rounds, reference {b.arms[0]})" for i, b in enumerate(blocks)]
    for arm in arms.values():
        env = " ".join(f"{k}={v}" for k, v in arm.env.items())
        lines.append(f"{arm.name} ({arm.note}; warm-up {arm.warmup_steps} steps): env {env}\n  {' '.join(arm.command)}")
    return "\n".join(lines)


def checks_table(checks: dict[str, dict]) -> list[str]:
    rows = []
    for name, check in checks.items():
        if not check["ok"]:
            rows.append([name, f"refused: {check['error']}"])
            continue
        undone = ", ".join(f"{k}={v['given']} (holds {v['holds']})" for k, v in check["inert"].items()) or "none"
        rows.append([name, "ok", undone, ", ".join(str(v) for v in check["gflop_per_token"].values())])
    header = ("arm", "config", "overrides Megatron Bridge undoes", "GFLOP/token: Megatron Bridge, 6N, 6N + attention")
    return report.table(header, rows)


def dry_run(args: argparse.Namespace) -> int:
    from bench import arm_check  # imports Megatron Bridge: only here and in the checking process

    _, arms, blocks = plan_of(args)
    print(describe(arms, blocks))
    record = {name: turns.arm_record(arm) for name, arm in arms.items()}
    checks = arm_check.check_record(record)
    print("\n".join(checks_table(checks)))
    return 0 if all(check["ok"] for check in checks.values()) else 2


def markdown(result: dict) -> str:
    record, analysis, plan = result["record"], result.get("analysis") or {}, levers.PLANS[result["plan"]]
    checks = result.get("checks") or {}
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
    lines += ["", *arms_table(record, analysis, checks), ""]
    lines += [f"Drift, {arm}: {drift_text(d)}." for arm, d in analysis.get("drift", {}).items()]
    if noise := analysis.get("loss_noise"):
        lines.append(f"Run-to-run loss noise (another seed): mean abs gap {noise['mean_abs']}, max {noise['max_abs']}.")
    lines += ["", *checks_table(checks)] if checks else []
    lines += ["", *(f"- {name}: `{' '.join(arm['command'])}`{env_text(arm)}" for name, arm in record["arms"].items())]
    return "\n".join(lines) + "\n"


def arms_table(record: dict, analysis: dict, checks: dict) -> list[str]:
    lines = report.table(ARM_COLUMNS)
    for name, arm in record["arms"].items():
        figures = analysis.get("arms", {}).get(name, {})
        tokens = figures.get("tokens_per_s_per_gpu")
        formulas = (checks.get(name) or {}).get("gflop_per_token", {})
        by_formula = ", ".join(str(round(tokens * gf / 1e3, 1)) for gf in formulas.values()) if tokens else "-"
        failure = arm.get("failure")
        ended = str(arm.get("returncode"))
        if failure:
            ended += f", {failure['why']}: {' / '.join(failure['last_lines'])}"
        cells = [name, arm["note"], figures.get("step_ms"), tokens, figures.get("logged_tflops_per_gpu")]
        cells += [figures.get("logged_gflop_per_token"), by_formula]
        cells += [f"{figures.get('peak_allocated_gb')}, {figures.get('peak_reserved_gb')}"]
        cells += [figures.get("counted_steps"), figures.get("first_counted_over_rest"), ended]
        lines.append(report.row(cells))
    return lines


def drift_text(drift: dict) -> str:
    low, high = drift["range_over_median"]
    return (
        f"last turn over first {drift['last_over_first']} across {drift['minutes']} min and {drift['turns']} turns;"
        f" turns {low}-{high} of their median"
    )


def env_text(arm: dict) -> str:
    extra = {k: v for k, v in arm["env"].items() if k != "SRUNSH_GPUS_PER_NODE"}
    return f" with {' '.join(f'{k}={v}' for k, v in extra.items())}" if extra else ""


def write(prefix: Path, result: dict, runs_dir: Path) -> str:
    found = {name: launches.scalars(runs_dir / name) for name in result["record"]["arms"]}
    result["analysis"] = per_step.analyse(result["record"], found)
    return report.write(prefix, result, markdown)


def start_checks(runs_dir: Path, arms: dict[str, turns.Arm]) -> subprocess.Popen:
    """The config checks in a process of their own, beside the first arms' start-up (it imports Megatron Bridge)."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    arms_path = runs_dir / "arms.json"
    arms_path.write_text(json.dumps({name: turns.arm_record(arm) for name, arm in arms.items()}))
    command = [sys.executable, "-m", "bench.arm_check", str(arms_path), str(runs_dir / "checks.json")]
    return subprocess.Popen(command, cwd=launches.REPO)


def collect_checks(runs_dir: Path, process: subprocess.Popen) -> dict:
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        return {}
    path = runs_dir / "checks.json"
    return json.loads(path.read_text()) if path.exists() else {}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    if args.report:
        recorded = report.json_path(args.prefix)
        if not recorded.is_file():
            print(f"bench.bench_turns: no {recorded}: --report rewrites the report of a call that ran", file=sys.stderr)
            return 2
        print(write(args.prefix, json.loads(recorded.read_text()), args.runs_dir))
        return 0
    started = time.monotonic()
    launches.stop_on_sigterm()
    plan, arms, blocks = plan_of(args)
    commands = {name: list(arm.command) for name, arm in arms.items()}
    result = {**launches.result_header(args.plan, args.gpus, commands), "plan": args.plan, "layers": plan.layers}
    args.out.mkdir(parents=True, exist_ok=True)
    launches.fix_dataset_helpers()
    checking = start_checks(args.runs_dir, arms)
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
        if not runner.record:  # stopped before the plan started: nothing to report
            checking.kill()
        else:
            result["record"] = runner.record
            result["checks"] = collect_checks(args.runs_dir, checking)
            print(write(args.prefix, result, args.runs_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
