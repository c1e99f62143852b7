"""Start-up A/B: seconds from the launch command to the first logged training step, and to each point before it (lines
both launches print: MARKERS), for our launch (A: srun.sh --local) and the upstream one (B: torchrun running
bench/upstream_pretrain.py) on the same recipe and overrides; rounds A B, then B A, after --warmup uncounted pairs.
bench/README.md says what the arms differ in, what --cold-caches and the bytecode count are for, and issue 48's goal.
Writes DIR/startup-CASE[-cold].{md,json} after every launch.
"""

import importlib.util
import re
import statistics
from pathlib import Path

from bench import launches, report

# The first console line that marks each point, in the order they come. Megatron Bridge 0.6.2 prints them on rank 0
# (training/initialize.py, training/setup.py: barrier_and_log), the iteration line on the last rank.
MARKERS = {
    "first line": re.compile(r"^"),  # A: srun.sh's own line; B: torchrun's or a rank's
    "imported": re.compile(r"upstream_pretrain\.py: imported"),  # B only
    "config built": re.compile(r"entrypoint\.py: outputs in |upstream_pretrain\.py: config built"),
    "distributed init": re.compile(r"> initializing torch distributed \.\.\."),
    "megatron initialized": re.compile(r"\[after megatron is initialized\]"),
    "model built": re.compile(r"\[after model, optimizer, and learning rate scheduler are built\]"),
    "data built": re.compile(r"\[after dataloaders are built\]"),
    "first step": launches.ITERATION,
}
GOAL = {"median": 0.8, "every round": 0.9}  # A/B time to first step
# Where the seconds go: (what, from marker, to marker); None is the launch command's start.
PHASES = (
    ("launcher, interpreter, imports, recipe build, overrides and checks", None, "config built"),
    ("  of which imports (B only)", None, "imported"),
    ("pretrain() up to distributed init (config finalize)", "config built", "distributed init"),
    ("distributed init, dataset helpers, JIT fusion warm-up", "distributed init", "megatron initialized"),
    ("tokenizer, model, optimizer", "megatron initialized", "model built"),
    ("data loaders", "model built", "data built"),
    ("training loop set-up and the first step", "data built", "first step"),
    ("launch to first step", None, "first step"),
)
STACK = ("torch", "megatron", "transformer_engine", "transformers", "modelopt")  # their bytecode is counted
STEPS = "train.train_iters=3"


def case_command(case: str, gpus: int, layers: int | None) -> tuple[str, tuple[str, ...]]:
    """Recipe and overrides. The Llama 3 8B shape keeps 4 of its 32 layers on one GPU (all 32 do not fit there)."""
    if case == "tiny":
        return launches.TINY, (STEPS, *launches.MEASURED)
    layers = layers or (4 if gpus == 1 else None)
    shape = (f"model.num_layers={layers}",) if layers else ()
    return launches.LLAMA_FP8, (STEPS, "train.global_batch_size=16", *shape, *launches.MEASURED)


def marks(lines: list[tuple[float, str]]) -> dict[str, float | None]:
    """Seconds to the first line of each marker; None where no line matched."""
    return {name: next((at for at, text in lines if pattern.search(text)), None) for name, pattern in MARKERS.items()}


def phase_seconds(mark: dict[str, float | None]) -> dict[str, float | None]:
    seconds = {}
    for what, start, end in PHASES:
        begin = 0.0 if start is None else mark.get(start)
        seconds[what] = round(mark[end] - begin, 2) if mark.get(end) is not None and begin is not None else None
    return seconds


def breakdown(runs: list[dict]) -> dict[str, dict[str, float | None]]:
    """Median seconds of each phase over the counted runs of each launch."""
    medians: dict[str, dict[str, float | None]] = {}
    for what, _, _ in PHASES:
        for launch in ("A", "B"):
            got = [r["phases"][what] for r in runs if r["launch"] == launch and r["round"] is not None]
            got = [s for s in got if s is not None]
            medians.setdefault(what, {})[launch] = round(statistics.median(got), 2) if got else None
    return medians


def cold_caches(run_dir: Path) -> dict[str, str]:
    """Empty Triton and TorchInductor caches of one launch's own (srun.sh keeps a TRITON_CACHE_DIR it is given)."""
    return {
        "TRITON_CACHE_DIR": str(run_dir / "triton-cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(run_dir / "inductor-cache"),
    }


def bytecode_cached(packages: tuple[str, ...] = STACK) -> dict[str, list[int]]:
    """Per installed package of PACKAGES: [its .py files with a cached .pyc of this interpreter, its .py files]."""
    counts = {}
    for package in packages:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        files = [f for folder in spec.submodule_search_locations for f in Path(folder).rglob("*.py")]
        cached = sum(Path(importlib.util.cache_from_source(str(f))).is_file() for f in files)
        counts[package] = [cached, len(files)]
    return counts


def bytecode_line(counts: dict[str, list[int]]) -> str:
    """How many of the stack's modules start without compiling, for the result's header."""
    cached, files = (sum(count[i] for count in counts.values()) for i in (0, 1))
    parts = ", ".join(f"{package} {count[0]:,}/{count[1]:,}" for package, count in counts.items())
    return f"Bytecode cached for {cached:,} of {files:,} .py files of the stack ({parts}); the image: all."


def label(run: dict) -> str | int:
    return "warm-up" if run["round"] is None else run["round"]


def markdown(result: dict) -> str:
    names = list(MARKERS)
    caches = "empty at every launch" if result["cold_caches"] else "each launcher's own, kept between its launches"
    lines = [
        f"# Start-up A/B, {result['case']}, {result['date']}",
        "",
        f"{result['hardware']}, {result['gpus']} GPU(s); {result['versions']}. Seconds since the launch command.",
        f"Triton and TorchInductor caches: {caches}.",
        bytecode_line(result["bytecode"]),
        "",
        *report.table(("round", "launch", "exit", "wall s", *names)),
    ]
    for run in result["runs"]:
        cells = [label(run), run["launch"], run["returncode"], run["wall_s"]]
        lines.append(report.row([*cells, *(run["marks"][name] for name in names)]))
    ratios = result["first_step_a_over_b"]
    lines += ["", f"A/B time to first step per round: {', '.join(map(str, ratios)) or '-'}; {launches.spread(ratios)}"]
    goal = result["goal"]
    lines += [f"(goal: median at most {goal['median']}, every round below {goal['every round']}).", ""]
    left = [
        f"{label(run)} {run['launch']}: {', '.join(run['left_behind'])}" for run in result["runs"] if run["left_behind"]
    ]
    lines += [f"Left running after a launch, and killed before the next: {'; '.join(left) or 'nothing'}.", ""]
    lines += report.table(("where the seconds go (median)", "A", "B", "A - B"))
    for what, medians in result["breakdown"].items():
        a, b = medians["A"], medians["B"]
        lines.append(report.row([what, a, b, round(a - b, 2) if a is not None and b is not None else None]))
    lines += ["", *(f"- {launch}: `{' '.join(command)}`" for launch, command in result["commands"].items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = report.parser("bench_startup", __doc__)
    parser.add_argument("--case", choices=("tiny", "llama8b-shape"), default="tiny")
    parser.add_argument("--gpus", type=int, choices=(1, 2), default=1, help="GPUs (ranks) per launch (default: 1)")
    parser.add_argument("--layers", type=int, help="llama8b-shape: layers (default: 4 on one GPU, else all 32)")
    parser.add_argument("--rounds", type=report.positive, default=2, help="A B, then B A, ... (default: 2)")
    parser.add_argument("--warmup", type=int, default=1, help="uncounted A B pairs first (default: 1)")
    parser.add_argument("--timeout", type=float, help="seconds one launch may run (default: no limit)")
    parser.add_argument(
        "--cold-caches", action="store_true", help="every launch starts with empty Triton and TorchInductor caches"
    )
    args = parser.parse_args(argv)
    launches.stop_on_sigterm()
    recipe, overrides = case_command(args.case, args.gpus, args.layers)
    commands = {"A": launches.ours(recipe, *overrides), "B": launches.upstream(recipe, *overrides, gpus=args.gpus)}
    result = {**launches.result_header(args.case, args.gpus, commands), "goal": GOAL, "runs": []}
    result["cold_caches"] = args.cold_caches
    result["bytecode"] = bytecode_cached()
    name = f"startup-{args.case}" + ("-cold" if args.cold_caches else "")
    prefix, runs_dir = args.out / name, args.out / f"{name}-runs"
    order = [(None, launch) for _ in range(args.warmup) for launch in "AB"] + launches.ab_rounds(args.rounds)
    launches.fix_dataset_helpers()
    for index, (round_index, launch) in enumerate(order):
        run_dir = runs_dir / f"{index}-{launch}"
        env = {"SRUNSH_GPUS_PER_NODE": str(args.gpus)} | (cold_caches(run_dir) if args.cold_caches else {})
        finished = launches.run(result["commands"][launch], run_dir, args.timeout, env)
        mark = marks(finished.lines)
        row = {"round": round_index, "launch": launch, "returncode": finished.returncode, "wall_s": finished.wall_s}
        row["left_behind"] = finished.left_behind
        result["runs"].append(row | {"marks": mark, "phases": phase_seconds(mark), "first_step_s": mark["first step"]})
        result["first_step_a_over_b"] = launches.per_round(result["runs"], "first_step_s")
        result["breakdown"] = breakdown(result["runs"])
        print({k: v for k, v in result["runs"][-1].items() if k != "phases"}, flush=True)
        table = report.write(prefix, result, markdown)
    print(table)


if __name__ == "__main__":
    main()
