"""Every launch example in README.md runs: its options through `srun.sh --dry-run`, and its recipe and overrides
through `entrypoint.py --check` for the example's node count (main() in this process: the worker has the training
stack imported, a new process would spend some 15 s of CPU importing it again). The "Your data" section runs as far
as CI can: its preparations, its check, and its launches the same way."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import entrypoint
from tests import hf_models
from tests.conftest import REPO, Corpus
from tests.srun_world import SQUASHFS_MAGIC

sys.path.insert(0, str(REPO / "tools"))
import prepare_data

README = (REPO / "README.md").read_text()
EXAMPLE = re.compile(
    r"^    ((?:salloc -N \d+(?: --\S+)* )?\./srun\.sh .*|SRUNSH_PYTHON=\S+ \./srun\.sh .*)$", re.MULTILINE
)
DATA_SECTION = README.split("\n## Your data\n", 1)[1].split("\n## ", 1)[0]
DATA_COMMANDS = re.findall(r"^    (\S.*)$", DATA_SECTION, re.MULTILINE)
DATA_DOCUMENTS = 3_000  # in each corpus of the data section
# Not the usage line; the data section's launches need its prepared data, and run in its own test.
EXAMPLES = [e for e in EXAMPLE.findall(README) if "RECIPE.py" not in e and e not in DATA_COMMANDS]
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
        words.pop(0)  # an environment prefix, SRUNSH_PYTHON=...
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


def run(command: list[str], variables: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **variables}
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)


def launch_variables(tmp_path: Path, options: list[str]) -> dict[str, str]:
    """What a launch of the examples has in its environment besides this process's."""
    sqsh = tmp_path / "megatron-lm+latest.sqsh"
    sqsh.write_bytes(SQUASHFS_MAGIC)
    return {
        "SRUNSH_SQSH": str(sqsh),
        "SRUNSH_MOUNT": f"{REPO}:/workspace/megatron,{tmp_path}:{tmp_path}",
        "SRUNSH_PYTHON": sys.executable,
        "SRUNSH_GPUS_PER_NODE": "2" if "--local" in options else "8",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "SRUNSH_NSYS": "true",
        "HF_HUB_OFFLINE": "1",
    }


@pytest.mark.parametrize("example", EXAMPLES)
def test_readme_example_passes_dry_run_and_preflight(example: str, tmp_path: Path, hf_dir, entrypoint_main):
    nodes, sbatch, options, recipe, arguments = split(example)
    arguments = [local_model(a, hf_dir) for a in arguments]
    if recipe in HUB_RECIPES and not any(a.startswith("hf_path=") for a in arguments):
        arguments.append(f"hf_path={hf_dir(HUB_RECIPES[recipe])}")
    variables = launch_variables(tmp_path, options)
    dry_run = ["--dry-run", *(o for o in options if o != "--dry-run")]
    submit = ["--sbatch", *sbatch, "--"] if sbatch else []
    result = run([str(REPO / "srun.sh"), *submit, *dry_run, *([recipe] if recipe else []), *arguments], variables)
    assert result.returncode == 0, result.stderr[-2000:]
    if "--health" in options:
        assert "launcher/health.py" in result.stdout
        return
    if "--nsys" in options:
        arguments.append("profiling.use_nsys_profiler=true")
    world_size = 2 if "--local" in options else 8 * nodes
    check = entrypoint_main(recipe, *arguments, "--check", "--world-size", str(world_size), env=variables)
    assert check.returncode == 0, check.stderr[-2000:]


def test_readme_recipe_example_is_a_working_recipe(tmp_path: Path, hf_dir, entrypoint_main):
    code = re.search(r"```python\n(.*?)```", README, re.DOTALL).group(1)
    recipe = tmp_path / "my_recipe.py"
    recipe.write_text(code)
    result = entrypoint_main(str(recipe), f"hf_path={hf_dir('llama')}", "use_megatron_fsdp=true", "--print-config")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "train_iters: 2000" in result.stdout


def fsx_of_the_data_section(root: Path, corpus: Corpus) -> Path:
    """The /fsx the "Your data" section names: its corpus (JSONL, and a folder of text files) and its model's folder,
    which holds the tokenizer trained for the tests."""
    fsx = root / "fsx"
    (fsx / "corpus" / "code").mkdir(parents=True)
    # Megatron Bridge's 9999:8:2 gives each split a document from 2,503 documents on, and the check refuses less
    texts = hf_models.sample_texts(DATA_DOCUMENTS)
    (fsx / "corpus" / "web.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    for number, text in enumerate(texts):
        (fsx / "corpus" / "code" / f"{number:04}.txt").write_text(text)
    shutil.copytree(corpus.tokenizer, fsx / "models" / "meta-llama" / "Meta-Llama-3-8B")
    return fsx


def test_readme_data_section_prepares_checks_and_launches(
    tmp_path: Path, corpus: Corpus, output_root: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    """Each command in turn, with /fsx a folder here: the preparations (the one under srun as the python command it
    runs in the image), the check, and each launch through srun.sh --dry-run and its check."""
    fsx = fsx_of_the_data_section(tmp_path, corpus)
    monkeypatch.chdir(REPO)
    ran = []
    for command in DATA_COMMANDS:
        words = [word.replace("/fsx/", f"{fsx}/").replace("$PWD", str(REPO)) for word in shlex.split(command)]
        if words[0] == "srun":  # a CPU node's step in the image: the python it runs, with the image's checkout here
            words = [word.replace("/workspace/megatron/", f"{REPO}/") for word in words[words.index("python3") :]]
        if words[:2] in (["python3", "tools/prepare_data.py"], ["python3", f"{REPO}/tools/prepare_data.py"]):
            assert prepare_data.main(words[2:]) == 0, capsys.readouterr().err[-2000:]
            ran.append("prepare")
        elif words[:2] == ["python3", "entrypoint.py"]:
            assert entrypoint.main(words[2:]) == 0, capsys.readouterr().err[-2000:]
            ran.append("check")
        else:
            nodes, _, options, recipe, arguments = split(" ".join(map(shlex.quote, words)))
            dry_run = run(
                [str(REPO / "srun.sh"), "--dry-run", *options, recipe, *arguments], launch_variables(tmp_path, options)
            )
            assert dry_run.returncode == 0, dry_run.stderr[-2000:]
            check = ["--check", "--world-size", str(8 * nodes)]
            assert entrypoint.main([recipe, *arguments, *check]) == 0, capsys.readouterr().err[-2000:]
            ran.append("launch")
    assert ran == ["prepare", "prepare", "check", "launch", "launch"]
    said = capsys.readouterr().err
    assert f"entrypoint.py: data: {fsx}/data/web ({DATA_DOCUMENTS:,} documents, " in said
    assert f"entrypoint.py: data: {fsx}/data/web (weight 0.7, {DATA_DOCUMENTS:,} documents, " in said
