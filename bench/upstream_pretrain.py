"""Baseline B of the benchmark: the upstream way to launch. torchrun runs this plain script, which builds the recipe,
applies the overrides with Megatron Bridge's own process_config_with_overrides, and calls pretrain: no
entrypoint.py, no VizTracer plugin, none of srun.sh's environment.

    torchrun --nproc-per-node=2 bench/upstream_pretrain.py [--viztracer-plugin] RECIPE.py [KEY=VALUE ...]

--viztracer-plugin installs viztracer_plugin.py as entrypoint.py does, and nothing else of ours (for
bench/bench_viztracer_overhead.py). Rank 0 prints a line after the imports and one once the config is built.
"""

import importlib.util
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the recipe imports recipes.shared

from megatron.bridge.training.gpt_step import forward_step
from megatron.bridge.training.pretrain import pretrain
from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

PLUGIN_FLAG = "--viztracer-plugin"


def split_arguments(arguments: list[str]) -> tuple[bool, str, list[str]]:
    """[--viztracer-plugin] RECIPE.py [KEY=VALUE ...] -> (with the plugin, recipe, overrides)."""
    with_plugin = arguments[:1] == [PLUGIN_FLAG]
    recipe_path, *overrides = arguments[1:] if with_plugin else arguments
    return with_plugin, recipe_path, overrides


def say(message: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        print(f"upstream_pretrain.py: {message}", flush=True)


def main() -> None:
    say("imported")
    with_plugin, recipe_path, overrides = split_arguments(sys.argv[1:])
    spec = importlib.util.spec_from_file_location("recipe", recipe_path)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    cfg = recipe.configure()
    if with_plugin:
        import viztracer_plugin

        viztracer_plugin.add_viztracer_field(cfg)
        viztracer_plugin.install()
    cfg = process_config_with_overrides(cfg, cli_overrides=overrides)
    say("config built")
    pretrain(cfg, forward_step_func=forward_step)
    if with_plugin:
        viztracer_plugin.exit_traced_process(0)


if __name__ == "__main__":
    main()
