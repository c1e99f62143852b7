"""What a rank imports before it trains, and the seconds each package takes: `python3 -X importtime entrypoint.py
RECIPE --check` for each recipe, with the package inits deferred and the names a pretrain never calls postponed
(SRUNSH_IMPORT_ALL=0, the default) and everything imported whole (SRUNSH_IMPORT_ALL=1), the arms alternating.
--check imports what training imports before pretrain() and builds and checks the config, without a GPU. The
launching host imports none of this: its supervisor is standard library only.

Seconds are importtime's own time of each module, summed by GROUPS; wall is the whole --check.
"""

import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict

from bench import launches, report

RECIPES = ("recipes/tiny_gpt_pretrain.py", "recipes/llama3_8b_h200_fp8cs_pretrain.py")
# How modules are summed: the first prefix a module's name starts with, else its top-level package.
GROUPS = (
    "megatron.bridge.models.conversion",
    "megatron.bridge.models.hf_pretrained",
    "megatron.bridge.models",
    "megatron.bridge.diffusion",
    "megatron.bridge.recipes",
    "megatron.bridge",
    "megatron.core",
    "megatron.training.training",
    "megatron.training",
    "modelopt.torch.quantization",
    "modelopt",
)
IMPORTTIME = re.compile(r"import time:\s+(\d+) \|\s+\d+ \| *(\S+)")


def group(module: str) -> str:
    named = (prefix for prefix in GROUPS if module == prefix or module.startswith(prefix + "."))
    return next(named, module.split(".", maxsplit=1)[0])


def imports(recipe: str, import_all: bool) -> dict:
    """One --check under importtime: seconds and module count of each group, and the wall seconds."""
    env = {**os.environ, "SRUN_SH_IMPORT_ALL": str(int(import_all)), "RUN_ID": "bench-imports"}
    command = [sys.executable, "-X", "importtime", str(launches.REPO / "entrypoint.py"), recipe, "--check"]
    started = time.monotonic()
    done = subprocess.run(command, cwd=launches.REPO, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    seconds: dict[str, float] = defaultdict(float)
    modules: dict[str, int] = defaultdict(int)
    for line in done.stderr.splitlines():
        if match := IMPORTTIME.match(line):
            seconds[group(match[2])] += int(match[1]) / 1e6
            modules[group(match[2])] += 1
    return {"returncode": done.returncode, "wall_s": round(wall, 2), "seconds": seconds, "modules": modules}


def median_of(runs: list[dict], field: str, name: str) -> float:
    return round(statistics.median(run[field].get(name, 0) for run in runs), 2)


def recipe_table(recipe: str, runs: dict[bool, list[dict]]) -> list[str]:
    """Per group: modules and median seconds in each arm, the biggest first."""
    names = {name for arm in runs.values() for run in arm for name in run["seconds"]}
    order = sorted(names, key=lambda name: -median_of(runs[True], "seconds", name))
    lines = [f"### {recipe}", ""]
    lines += report.table(("package", "modules, whole", "s, whole", "modules, deferred", "s, deferred"))
    for name in order:
        whole, deferred = runs[True], runs[False]
        cells = [median_of(whole, "modules", name), median_of(whole, "seconds", name)]
        cells += [median_of(deferred, "modules", name), median_of(deferred, "seconds", name)]
        if cells[1] >= 0.05 or cells[0] != cells[2]:
            lines.append(report.row([f"`{name}`", *cells]))
    for label, arm in (("whole", runs[True]), ("deferred", runs[False])):
        totals = [round(sum(run["seconds"].values()), 2) for run in arm]
        walls = [run["wall_s"] for run in arm]
        lines.append(f"\n{label}: imports {totals} s, --check wall {walls} s (exit {[r['returncode'] for r in arm]})")
    ratios = [d["wall_s"] / w["wall_s"] for w, d in zip(runs[True], runs[False], strict=True)]
    lines.append(f"\ndeferred/whole --check wall, round by round: {launches.spread(ratios)}")
    return lines


def markdown(result: dict) -> str:
    lines = [f"# Rank imports, {result['date']}", "", f"{result['python']}; {result['rounds']} rounds a recipe.", ""]
    for recipe, runs in result["recipes"].items():
        lines += [*recipe_table(recipe, {True: runs["whole"], False: runs["deferred"]}), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = report.parser("bench_imports", __doc__)
    parser.add_argument("--recipe", action="append", help=f"recipe to measure, repeatable (default: {RECIPES})")
    parser.add_argument("--rounds", type=report.positive, default=3, help="runs of each arm (default: 3)")
    args = parser.parse_args(argv)
    result = {"date": report.timestamp(), "python": sys.version.split()[0], "rounds": args.rounds, "recipes": {}}
    for recipe in args.recipe or RECIPES:
        runs: dict[str, list[dict]] = {"whole": [], "deferred": []}
        for round_ in range(args.rounds):
            for arm in ("whole", "deferred") if round_ % 2 == 0 else ("deferred", "whole"):
                runs[arm].append(imports(recipe, import_all=arm == "whole"))
        result["recipes"][recipe] = runs
        table = report.write(args.out / "imports", result, markdown)
    print(table)


if __name__ == "__main__":
    main()
