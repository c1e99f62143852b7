"""entrypoint.py started as a program holds Python's cyclic garbage collector through its imports and its recipe, and
lets it run again, with what start-up made frozen, before it trains: with the real Megatron Bridge and the shipped
recipes, pretrain() alone replaced (it needs a GPU) by one that says what it found."""

import gc
import json
import subprocess
import sys

import pytest

import entrypoint
from tests.conftest import REPO

# A recipe that builds a shipped one and replaces the pretrain() that entrypoint.py's train() calls.
PROBE = """
import gc, json, sys
from recipes import {recipe}

def configure():
    seen = {{"in the recipe": gc.isenabled()}}

    def pretrain(cfg, **kwargs):
        seen["at pretrain"] = gc.isenabled()
        seen["frozen"] = gc.get_freeze_count()
        gc.unfreeze()
        seen["start-up garbage"] = gc.collect()
        print("seen " + json.dumps(seen), flush=True)

    sys.modules["__main__"].pretrain = pretrain
    return {recipe}.configure()
"""


def seen_at_pretrain(tmp_path, run_entrypoint, recipe: str) -> dict:
    probe = tmp_path / "probe_recipe.py"
    probe.write_text(PROBE.format(recipe=recipe))
    done = run_entrypoint(str(probe), "train.train_iters=1", env={"RANK": "0", "WORLD_SIZE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("seen "))[5:])


# Without hf_path, and with one: the Llama recipe's architecture is Meta's published config.json, read by transformers
@pytest.mark.parametrize("recipe", ["tiny_gpt_pretrain", "llama3_8b_pretrain"])
def test_the_collector_waits_for_the_start_up_and_runs_for_the_training(tmp_path, run_entrypoint, recipe):
    seen = seen_at_pretrain(tmp_path, run_entrypoint, recipe)
    assert seen["in the recipe"] is False
    assert seen["at pretrain"] is True
    # the imported modules' objects: some 900,000 on the CPU here
    assert seen["frozen"] > 300_000, seen
    # what start-up left unreachable, kept for good: some 15,000 objects (8 MB)
    assert seen["start-up garbage"] < 60_000, seen


def test_a_process_multiprocessing_spawns_keeps_its_collector():
    """multiprocessing's spawn runs entrypoint.py again as __mp_main__ in every process it starts (Megatron's
    checkpoint writer starts a Manager): such a process lives on, and must collect its garbage."""
    program = (
        "import gc, runpy\n"
        "frozen = gc.get_freeze_count()  # the interpreter freezes a few of its own at start\n"
        f"runpy.run_path({str(REPO / 'entrypoint.py')!r}, run_name='__mp_main__')\n"
        "print(gc.isenabled(), gc.get_freeze_count() - frozen)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["True", "0"]


def test_imported_as_a_module_it_leaves_the_collector_alone():
    """Tests and tools import entrypoint.py: their process's collector is theirs."""
    assert entrypoint.COLLECTOR_HELD is False
    assert gc.isenabled()
