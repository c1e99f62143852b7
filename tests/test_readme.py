"""Every launch example in README.md runs: its options through `srun.sh --dry-run`, and its recipe and overrides
through the same pre-flight check srun.sh runs (`entrypoint.py --check`) for the example's node count."""

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import hf_models
from tests.conftest import REPO

README = (REPO / "README.md").read_text()
EXAMPLE = re.compile(r"^    ((?:salloc -N \d+(?: --\S+)* )?\./srun\.sh .*|PYTHON=\S+ \./srun\.sh .*)$", re.MULTILINE)
EXAMPLES = [e for e in EXAMPLE.findall(README) if "RECIPE.py" not in e]  # not the usage line
SRUN_OPTIONS = {"--nsys", "--dry-run", "--no-container", "--local", "--health"}
# The local Hugging Face shapes that stand in for the README's /fsx model folders and for the hub (no network here).
HF_SHAPES = {"DeepSeek-V2-Lite": "deepseek_v2", "DeepSeek-V2": "deepseek_v2", "Qwen3-30B-A3B": "qwen3_moe"}
HUB_RECIPES = {f"recipes/{recipe}.py": shape for recipe, shape in hf_models.RECIPE_SHAPES.items() if shape}


def split(example: str) -> tuple[int, list[str], list[str], str, list[str]]:
    """-> nodes, sbatch options (with --sbatch), srun.sh options, recipe, NAME=VALUE arguments."""
    words = shlex.split(example)
    nodes, sbatch = 1, []
    if words[0] == "salloc":
        nodes = int(words[2])
        words = words[words.index("./srun.sh") :]
    while "=" in words[0] and not words[0].startswith("./"):
        words.pop(0)  # an environment prefix, PYTHON=...
    words = words[1:]  # ./srun.sh
    if words[0] == "--sbatch":
        sbatch, words = words[1 : words.index("--")], words[words.index("--") + 1 :]
        nodes = int(sbatch[sbatch.index("-N") + 1])
    options = [w for w in words if w in SRUN_OPTIONS]
    rest = [w for w in words if w not in SRUN_OPTIONS] or [""]  # --health takes no recipe
    return nodes, sbatch, options, rest[0], rest[1:]


def local_model(argument: str, hf_dir: Callable[[str], Path]) -> str:
    if not argument.startswith("hf_path=/fsx/"):
        return argument
    return f"hf_path={hf_dir(HF_SHAPES[Path(argument).name])}"


def test_readme_has_the_launch_examples():
    assert len(EXAMPLES) >= 10
    assert any("--nsys" in e for e in EXAMPLES) and any("use_viztracer=true" in e for e in EXAMPLES)


def run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("example", EXAMPLES)
def test_readme_example_passes_dry_run_and_preflight(example: str, tmp_path: Path, hf_dir, output_root: Path):
    nodes, sbatch, options, recipe, arguments = split(example)
    arguments = [local_model(a, hf_dir) for a in arguments]
    if recipe in HUB_RECIPES and not any(a.startswith("hf_path=") for a in arguments):
        arguments.append(f"hf_path={hf_dir(HUB_RECIPES[recipe])}")
    sqsh = tmp_path / "megatron-lm+latest.sqsh"
    sqsh.touch()
    env = {
        **os.environ,
        "SQSH": str(sqsh),
        "MOUNT": f"{REPO}:/workspace/megatron,{tmp_path}:{tmp_path}",
        "PYTHON": sys.executable,
        "GPUS_PER_NODE": "2" if "--local" in options else "8",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NSYS": "true",
        "HF_HUB_OFFLINE": "1",
    }
    dry_run = ["--dry-run", *(o for o in options if o != "--dry-run")]
    submit = ["--sbatch", *sbatch, "--"] if sbatch else []
    result = run([str(REPO / "srun.sh"), *submit, *dry_run, *([recipe] if recipe else []), *arguments], env)
    assert result.returncode == 0, result.stderr[-2000:]
    if "--health" in options:
        assert "launcher/health.py" in result.stdout
        return
    if "--nsys" in options:
        arguments.append("profiling.use_nsys_profiler=true")
    world_size = 2 if "--local" in options else 8 * nodes
    check = run([sys.executable, "entrypoint.py", recipe, *arguments, "--check", "--world-size", str(world_size)], env)
    assert check.returncode == 0, check.stderr[-2000:]


def test_readme_recipe_example_is_a_working_recipe(tmp_path: Path, hf_dir, run_entrypoint):
    code = re.search(r"```python\n(.*?)```", README, re.DOTALL).group(1)
    recipe = tmp_path / "my_recipe.py"
    recipe.write_text(code)
    result = run_entrypoint(str(recipe), f"hf_path={hf_dir('llama')}", "use_megatron_fsdp=true", "--print-config")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "train_iters: 2000" in result.stdout
