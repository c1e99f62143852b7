"""Baseline B of the benchmarks, the upstream way to launch: `torchrun --nproc-per-node=N bench/upstream_pretrain.py
RECIPE.py [KEY=VALUE ...]` builds the recipe, applies the overrides with Megatron Bridge's own
process_config_with_overrides, and calls pretrain: no entrypoint.py, none of srun.sh's environment. Rank 0 prints a
line after the imports and one once the config is built.
"""

import importlib.util
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the recipe imports recipes.shared

from megatron.bridge.training.gpt_step import forward_step
from megatron.bridge.training.pretrain import pretrain
from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides


def say(message: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        print(f"upstream_pretrain.py: {message}", flush=True)


def main() -> None:
    say("imported")
    recipe_path, *overrides = sys.argv[1:]
    spec = importlib.util.spec_from_file_location("recipe", recipe_path)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    cfg = process_config_with_overrides(recipe.configure(), cli_overrides=overrides)
    say("config built")
    pretrain(cfg, forward_step_func=forward_step)


if __name__ == "__main__":
    main()
