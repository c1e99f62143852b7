#!/usr/bin/env python3
"""Run one rank of a Megatron Bridge pretraining job: load a recipe, apply NAME=VALUE overrides, check, train.

    python3 entrypoint.py RECIPE.py [NAME=VALUE ...]                 train (srun.sh starts one per GPU)
    python3 entrypoint.py RECIPE.py [NAME=VALUE ...] --print-config  print the resolved config as YAML, and exit
    python3 entrypoint.py RECIPE.py [NAME=VALUE ...] --check [--world-size N]
                                                                      validate, print `profile_ranks=...`, and exit

A NAME that is a parameter of the recipe's configure() is passed to it (hf_path=..., use_megatron_fsdp=true,
data_paths=[0.7,/fsx/a,0.3,/fsx/b] with tokenizer_path=DIR: datasets made by tools/prepare_data.py, else mock data);
every other NAME=VALUE overrides the returned ConfigContainer (train.train_iters=1000). Values use Hydra's grammar.
mixed_precision=NAME picks a Megatron Bridge preset (bf16_with_fp8_current_scaling_mixed); mixed_precision.FIELD=VALUE
then changes one of its fields (mixed_precision.first_last_layers_bf16=false).
Bad input is one line on stderr and exit status 2, before distributed init or any GPU work.
"""

from __future__ import annotations  # the training stack's names in annotations are not needed to define functions

import argparse
import gc
import importlib.util
import io
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from types import ModuleType
from typing import NoReturn, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent))  # recipes import recipes.shared; user recipes may too

from launcher.errors import UsageError, report, stack_fix

# --check and --print-config: stdout holds only the YAML or profile_ranks; chatter held back (docs/launch.md).
QUIET = bool({"--check", "--print-config"} & set(sys.argv[1:]))


@contextmanager
def chatter_held_back(quiet: bool) -> Iterator[None]:
    if not quiet:
        with redirect_stdout(sys.stderr):  # training: chatter on stderr, stdout stays the training log
            yield
        return
    chatter = io.StringIO()
    unexpected = True
    try:
        with redirect_stdout(chatter), redirect_stderr(chatter):
            yield
        unexpected = False
    except (UsageError, ImportError):
        unexpected = False
        raise
    finally:
        if unexpected:
            sys.stderr.write(chatter.getvalue())


# The cyclic garbage collector is held until start-up is done: 7.8 s instead of 9.0 s for a --check (docs/launch.md).
COLLECTOR_HELD = __name__ == "__main__"
if COLLECTOR_HELD:
    gc.disable()

# A process multiprocessing's "spawn" starts (__mp_main__) needs none of the training stack (docs/launch.md).
if __name__ != "__mp_main__":
    try:
        with chatter_held_back(QUIET):
            from megatron.bridge.training.callbacks import CallbackManager
            from megatron.bridge.training.config import ConfigContainer
            from megatron.bridge.training.gpt_step import forward_step
            from megatron.bridge.training.pretrain import pretrain

            import viztracer_plugin
            from launcher.checkpoints import defaults, intervals
            from launcher.config import checks, data, grammar, outputs, overrides, run_env
            from launcher.hang import dumps as hang_dumps
            from launcher.hang import progress
            from launcher.rank import nsys
            from launcher.restart import exit_after_failure, inprocess, straggler
            from launcher.restart import log as restart_log
    except ImportError as error:  # an image or Python without Megatron Bridge: which one, and how to get one with it
        stack = f"{type(error).__name__}: {error}"
        report(UsageError(f"{sys.executable} cannot import the training stack ({stack}): {stack_fix()}"))
        sys.exit(2)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see entrypoint.py --help)")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = Parser(prog="entrypoint.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", type=Path, help="recipe file whose configure() returns a ConfigContainer")
    parser.add_argument("assignments", nargs="*", metavar="NAME=VALUE", help="configure() argument or config override")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    mode.add_argument("--check", action="store_true", help="validate, print profile_ranks=..., and exit")
    parser.add_argument("--world-size", type=int, help="ranks the job will have (default: $WORLD_SIZE)")
    return parser.parse_intermixed_args(argv)


def load_recipe(path: Path) -> ModuleType:
    if not path.is_file():
        raise UsageError(f"recipe {str(path)!r} not found: pass a recipe file, e.g. recipes/tiny_gpt_pretrain.py")
    spec = importlib.util.spec_from_file_location(f"recipe_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise UsageError(f"recipe {str(path)!r} is not a Python file: recipes are .py files defining configure()")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except (SyntaxError, ImportError, OSError) as error:
        raise UsageError(f"recipe {str(path)!r} failed to import: {type(error).__name__}: {error}") from None
    if not callable(getattr(module, "configure", None)):
        raise UsageError(f"recipe {str(path)!r} has no configure() function: define configure(**kwargs) -> config")
    return module


def world_size(args: argparse.Namespace) -> int | None:
    """The job's rank count: --world-size (srun.sh's pre-flight), else $WORLD_SIZE (a rank), else unknown."""
    return args.world_size or (int(os.environ["WORLD_SIZE"]) if "WORLD_SIZE" in os.environ else None)


def resolve(args: argparse.Namespace) -> tuple[ConfigContainer, dict[str, object]]:
    """Recipe + arguments -> checked config, and what the arguments set in it. No distributed init, no GPU."""
    recipe = load_recipe(args.recipe)
    parsed = grammar.parse(args.assignments)
    cfg, applied = overrides.configured(recipe, parsed, outputs.run_dir(args.recipe))
    defaults.apply(cfg, set(applied))  # async_save's strategy; local checkpoints on SRUNSH_LOCAL_CKPT_DIR
    checks.check_config(cfg, world_size(args))
    return cfg, applied


def say_what_it_trains_on(cfg: ConfigContainer, stream: TextIO) -> None:
    """Once a run (rank 0, or --check): its datasets, or that it trains on mock data."""
    if line := data.describe(cfg):
        print(f"entrypoint.py: {line}", file=stream, flush=True)


def train(cfg: ConfigContainer, recipe: Path, applied: dict[str, object], argv: list[str]) -> None:
    profiled = nsys.profile_command(cfg, [sys.argv[0], *argv])
    if profiled is not None:
        nsys.exec_under_nsys(profiled)
    run_env.set_cuda_device_max_connections(cfg)
    run_env.disable_missing_gradient_accumulation_fusion(cfg)
    rank, run_dir = int(os.environ.get("RANK", "0")), outputs.run_dir(recipe)
    to_choose = defaults.to_choose(cfg, set(applied))
    if rank == 0:
        outputs.save_run_record(cfg, run_dir)
        for key, value in applied.items():
            print(f"entrypoint.py: {key} = {value!r}", flush=True)
        say_what_it_trains_on(cfg, sys.stdout)
        print(f"entrypoint.py: {defaults.describe(cfg, to_choose)}", flush=True)
        print(f"entrypoint.py: outputs in {run_dir}", flush=True)
    viztracer_plugin.install()
    restarts = inprocess.restart_enabled(cfg)
    hang_dumps.install(run_dir, rank, restarts)  # answers srun.sh's hang report: stacks and flight recorder
    callbacks = CallbackManager()
    intervals.register(callbacks, to_choose)  # before progress, which reads the intervals it sets
    progress.register(callbacks, run_dir, rank)  # the step record srun.sh's hang watch reads
    straggler.install(cfg.nvrx_straggler, run_dir)  # scores to RUN_DIR/stragglers.log, a straggler named on the console
    if restarts:
        inprocess.pass_the_call_wrapper()  # an upstream defect: _pretrain would not know it restarts
        restart_log.register(callbacks, run_dir)  # a line per in-process restart
    else:
        exit_after_failure.install()  # the rank exits even when Megatron Bridge's clean-up after an error hangs
    pretrain(cfg, forward_step_func=forward_step, callbacks=callbacks)
    viztracer_plugin.exit_traced_process(0)


def main(argv: list[str]) -> int:
    try:
        args = parse_args(argv)
        with chatter_held_back(args.check or args.print_config):
            cfg, applied = resolve(args)
        if args.print_config:
            print(outputs.config_yaml(cfg), end="")
        elif args.check:
            say_what_it_trains_on(cfg, sys.stderr)
            ranks = checks.profiled_ranks(cfg, world_size(args) or 1)
            print("profile_ranks=" + ",".join(str(rank) for rank in ranks))
        else:
            if COLLECTOR_HELD:  # what start-up made is set aside for good, and the collector runs again
                gc.freeze()
                gc.enable()
            train(cfg, args.recipe, applied, argv)
    except UsageError as error:
        report(error)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
