"""Validation cost: wall time of `entrypoint.py RECIPE --print-config` for every shipped recipe on this machine.

    python3 bench/bench_print_config.py PREFIX [--repeat N]   # prints a table; writes PREFIX.json/.md

srun.sh's pre-flight (`entrypoint.py --check` on the launching host) does the same work: import Megatron Bridge, build
the recipe, apply and check the overrides. Recipes that read a hub model get hf_path= a local folder of the same
shape (tests/hf_models.py), as a user's hf_path=/fsx/... would be. Target: 20 s per recipe.
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.hf_models, bench.report

from bench import report
from tests import hf_models

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 20.0


def model_folders(scratch: Path) -> dict[str, Path]:
    """One Hugging Face folder per shape the recipes read (both DeepSeek recipes share one)."""
    shapes = {shape for shape in hf_models.RECIPE_SHAPES.values() if shape}
    return {shape: hf_models.write(shape, scratch / shape) for shape in shapes}


def time_print_config(recipe: str, arguments: list[str], outputs: Path) -> float:
    command = [sys.executable, str(REPO / "entrypoint.py"), str(REPO / "recipes" / f"{recipe}.py"), *arguments]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OUTPUT_ROOT": str(outputs)}
    start = time.monotonic()
    subprocess.run([*command, "--print-config"], cwd=REPO, env=env, capture_output=True, check=True, timeout=300)
    return time.monotonic() - start


def measure(repeat: int) -> dict[str, dict]:
    rows = {}
    with tempfile.TemporaryDirectory() as scratch:
        folders = model_folders(Path(scratch))
        for recipe, shape in sorted(hf_models.RECIPE_SHAPES.items()):
            arguments = [f"hf_path={folders[shape]}"] if shape else []
            seconds = [time_print_config(recipe, arguments, Path(scratch) / "outputs") for _ in range(repeat)]
            rows[recipe] = {
                "median_s": round(statistics.median(seconds), 1),
                "max_s": round(max(seconds), 1),
                "runs": [round(s, 1) for s in seconds],
            }
            print(recipe, rows[recipe], flush=True)
    return rows


def markdown(result: dict) -> str:
    lines = [
        f"# `entrypoint.py --print-config` time, {result['date']}",
        "",
        f"{result['machine']}; target {TARGET_S:.0f} s per recipe.",
        "",
        "| recipe | median s | max s | runs |",
        "|---|---|---|---|",
    ]
    for recipe, row in result["recipes"].items():
        lines.append(f"| {recipe} | {row['median_s']} | {row['max_s']} | {', '.join(map(str, row['runs']))} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prefix", type=Path)
    parser.add_argument("--repeat", type=int, default=3, help="runs per recipe (default: 3)")
    args = parser.parse_args()
    result = {
        "date": report.timestamp(),
        "machine": f"{os.cpu_count()} CPUs ({platform.machine()}), Python {platform.python_version()}",
        "recipes": measure(args.repeat),
    }
    print(report.write(args.prefix, result, markdown))


if __name__ == "__main__":
    main()
