"""A process started with multiprocessing's "spawn" from a rank (Megatron's checkpoint writer starts its Manager so at
a run's first save) runs entrypoint.py again as __mp_main__ before its task. It must not import the training stack
there: on the H200 that made a first save take 28 s, past torchrun's 30 s grace for a SIGTERM-save with the rest."""

import subprocess
import sys

from tests.conftest import REPO


def test_a_process_spawned_by_a_rank_does_not_import_the_training_stack():
    recipe = REPO / "tests" / "fixtures" / "spawn_recipe.py"
    done = subprocess.run(
        [sys.executable, str(REPO / "entrypoint.py"), str(recipe)],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert "spawned child imported the training stack: False" in done.stderr, done.stderr[-3000:]
    assert done.returncode == 2  # the recipe's refusal, reported as bad input
