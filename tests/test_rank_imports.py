"""A rank imports its packages as a plain interpreter does: nothing of the launcher's stands on sys.meta_path or in
builtins.__import__, and megatron.bridge.__version__ reads the same in both (the import machinery that made them
differ, launcher/imports/, is gone). The rank here is entrypoint.py started as srun.sh starts it, with a recipe that
looks at what its process imported."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# What a process says of its imports: Megatron Bridge's version, read as an attribute and by a from-import, the import
# function, and every finder on sys.meta_path.
LOOK = """
import builtins, json, sys
import megatron.bridge
from megatron.bridge import __version__

def what_was_imported():
    finders = [finder if isinstance(finder, type) else type(finder) for finder in sys.meta_path]
    return {
        "attribute": megatron.bridge.__version__,
        "from_import": __version__,
        "__import__": repr(builtins.__import__),
        "meta_path": [f"{finder.__module__}.{finder.__qualname__}" for finder in finders],
    }
"""
RECIPE = f"""{LOOK}
import os
from pathlib import Path
from recipes.tiny_gpt_pretrain import configure as tiny

def configure():
    Path(os.environ["LOOKED"]).write_text(json.dumps(what_was_imported()))
    return tiny()
"""


def test_a_rank_imports_megatron_bridge_as_a_plain_interpreter_does(run_entrypoint, tmp_path: Path):
    recipe, looked = tmp_path / "looking_recipe.py", tmp_path / "rank.json"
    recipe.write_text(RECIPE)
    rank = run_entrypoint(str(recipe), "--check", "--world-size", "1", env={"LOOKED": str(looked), "RANK": "0"})
    assert rank.returncode == 0, rank.stderr
    plain = subprocess.run(
        [sys.executable, "-c", f"{LOOK}\nprint(json.dumps(what_was_imported()))"],
        capture_output=True, text=True, check=True, cwd=REPO, timeout=300,
    )  # fmt: skip

    in_rank, in_plain = json.loads(looked.read_text()), json.loads(plain.stdout.splitlines()[-1])
    assert in_rank == in_plain
    assert in_plain["attribute"] == in_plain["from_import"] != ""
