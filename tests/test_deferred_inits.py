"""launcher/imports/deferred_inits.py on the installed Megatron Bridge and ModelOpt: `entrypoint.py --check` of a recipe
without hf_path imports none of the modules bench/results/startup.md marks unneeded (and SRUNSH_IMPORT_ALL=1 imports
them, as a plain import does), and every public name of a deferred package,
as the package's own `__init__` makes it, and every name of torch, os, typing and pickle is the same object when it is
asked for before that `__init__` ran; a name no file of the package spells imports nothing unneeded, nor does
torch.compile in a rank."""

import json
import os
import subprocess
import sys
from pathlib import Path

# Not tests.conftest's REPO: the subprocesses below import this module for unneeded(), and conftest's imports
# (transformers, tokenizers, pytest) would cost each of them seconds, with modules no rank imports.
REPO = Path(__file__).resolve().parent.parent
TINY = str(REPO / "recipes" / "tiny_gpt_pretrain.py")
LLAMA = str(REPO / "recipes" / "llama3_8b_pretrain.py")  # hf_path by default: recipes/hf_configs/llama3_8b
# What a GPT pretrain from a recipe never calls (bench/results/startup.md, "What a recipe needs"): the model bridges
# and Hugging Face conversion, the diffusion models and their packages, PEFT, ModelOpt's export and search modes.
UNNEEDED = (
    "diffusers",
    "peft",
    "megatron.bridge.diffusion",
    "megatron.bridge.models.conversion.auto_bridge",
    "megatron.bridge.models.llama",
    "megatron.bridge.models.qwen",
    "megatron.bridge.models.deepseek",
    "megatron.bridge.recipes.llama",
    "modelopt.torch.export",
    "modelopt.torch.speculative",
    "modelopt.torch.sparsity",
    "modelopt.torch.nas",
)

# Nor these, which Megatron Bridge's dataset builders, ModelOpt's distillation plugin and Megatron-LM's training loop
# import at their top for names an SFT, a VLM, a distillation or a refit calls (launcher/imports/deferred_names.py
# postpones those names). transformers' candidate_generator imports scikit-learn, and with it scipy and pandas, where it
# is installed (here: versions.txt's [test]); every hf_path recipe imports candidate_generator.
NEVER_CALLED = (
    "datasets",
    "pandas",
    "pyarrow",
    "megatron.core.resharding",
    "megatron.energon",
    "modelopt.torch.quantization",
    "scipy",
    "sklearn",
    "torchvision",
    "transformers.generation.candidate_generator",
    "transformers.processing_utils",
)


# `entrypoint.py RECIPE --check`, then the names in sys.modules as it exits: -X importtime misses a module imported
# through importlib.import_module, as the deferred packages' names are.
CHECK = """
import atexit, runpy, sys
atexit.register(lambda: print("MODULES", *sorted(sys.modules), file=sys.__stderr__))
sys.argv = ["entrypoint.py", *sys.argv[1:], "--check"]
runpy.run_path("entrypoint.py", run_name="__main__")
"""


def imported_modules(import_all: str, recipe: str = TINY, *arguments: str) -> set[str]:
    env = {**os.environ, "SRUN_SH_IMPORT_ALL": import_all}
    command = [sys.executable, "-c", CHECK, recipe, *arguments]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = (line for line in done.stderr.splitlines() if line.startswith("MODULES "))
    return set(line.split()[1:])


def unneeded(modules: set[str], packages: tuple[str, ...] = UNNEEDED) -> list[str]:
    return sorted(p for p in packages if any(m == p or m.startswith(p + ".") for m in modules))


def test_a_recipe_without_hf_path_imports_none_of_the_unneeded_modules():
    modules = imported_modules("0")
    assert unneeded(modules) == []
    assert unneeded(modules, NEVER_CALLED) == []


def test_import_all_imports_them_as_a_plain_import_does():
    modules = imported_modules("1")
    assert unneeded(modules) == sorted(UNNEEDED)
    assert unneeded(modules, NEVER_CALLED) == sorted(NEVER_CALLED)


# A rank's data loaders for the tiny recipe (mock data), built on the CPU after its config as Megatron Bridge's setup()
# builds them: its own loaders, the mock GPT dataset, its index builder, a first batch. Megatron Bridge makes one flag
# tensor on the GPU; here it is made on the CPU. Prints whether the postponed names still wait, and the modules that
# building imported.
DATA_LOADERS = r"""
import os, runpy, socket, sys
with socket.socket() as free:
    free.bind(("127.0.0.1", 0))
    port = str(free.getsockname()[1])
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
entrypoint = runpy.run_path("entrypoint.py", run_name="rank")
import torch
from launcher.imports import deferred_names
from megatron.bridge.data.loaders import setup_data_iterators
from megatron.bridge.data.utils import get_dataset_provider
from megatron.bridge.training.setup import _bind_dataset_provider_context
from megatron.bridge.training.state import TrainState
from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer
from megatron.core import parallel_state
from megatron.core.process_groups_config import ProcessGroupCollection
cfg, _ = entrypoint["resolve"](entrypoint["parse_args"](sys.argv[1:]))
cfg.validate()
torch.distributed.init_process_group("gloo")
parallel_state.initialize_model_parallel()
groups = ProcessGroupCollection.use_mpu_process_groups()
cfg.dataset.tokenizer = tokenizer = build_tokenizer(cfg.tokenizer)
provider = _bind_dataset_provider_context(get_dataset_provider(cfg.dataset), tokenizer=tokenizer, pg_collection=groups)
made = torch.tensor
torch.tensor = lambda *args, device=None, **kwargs: made(*args, **kwargs)
before = set(sys.modules)
loaders = setup_data_iterators(
    cfg=cfg, train_state=TrainState(), model_length=1, train_valid_test_datasets_provider=provider, dp_group=groups.dp
)
next(loaders[0])
print("WAITING", deferred_names.STATE.deferring, file=sys.__stderr__)
print("MODULES", *sorted(set(sys.modules) - before), file=sys.__stderr__)
"""
# What Megatron Bridge's data loaders import to check whether the model is a MIMO one (its Hugging Face provider)
MIMO_DATA = ("accelerate", "megatron.bridge.data.megatron_mimo.hf_provider", "transformers.models.auto.auto_factory")


def test_a_mock_pretrains_data_loaders_import_no_hugging_face_data_code_and_leave_the_postponed_names_waiting():
    command = [sys.executable, "-c", DATA_LOADERS, TINY, "train.train_iters=3"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert "WAITING True" in lines
    (line,) = (line for line in lines if line.startswith("MODULES "))
    assert unneeded(set(line.split()[1:]), MIMO_DATA + NEVER_CALLED) == []


# Megatron Bridge's Hugging Face model wrapper, which the model bridges import, binds transformers' ProcessorMixin, and
# transformers' model classes import its generation utilities
MODEL_CLASSES_IMPORT = ["torchvision", "transformers.generation.candidate_generator", "transformers.processing_utils"]


def test_a_recipe_with_hf_path_imports_the_model_bridge_of_its_architecture_alone():
    modules = imported_modules("0", LLAMA)
    assert "megatron.bridge.models.llama.llama_bridge" in modules
    conversion, llama = "megatron.bridge.models.conversion.auto_bridge", "megatron.bridge.models.llama"
    assert unneeded(modules) == [conversion, llama, "megatron.bridge.recipes.llama"]
    assert unneeded(modules, NEVER_CALLED) == MODEL_CLASSES_IMPORT


def test_a_deepseek_recipe_imports_the_deepseek_bridge_alone(hf_dir):
    # registered by its name, looked up by transformers' class of that name
    recipe = str(REPO / "recipes" / "deepseek_v2_lite_pretrain.py")
    modules = imported_modules("0", recipe, f"hf_path={hf_dir('deepseek_v2')}")
    assert "megatron.bridge.models.deepseek.deepseek_v2_bridge" in modules
    assert unneeded(modules) == ["megatron.bridge.models.conversion.auto_bridge", "megatron.bridge.models.deepseek"]
    assert unneeded(modules, NEVER_CALLED) == MODEL_CLASSES_IMPORT


def assert_same_config(run_entrypoint, recipe: str, *arguments: str) -> None:
    configs = {}
    for import_all in ("0", "1"):
        env = {"SRUN_SH_IMPORT_ALL": import_all}
        result = run_entrypoint(recipe, *arguments, "train.train_iters=20", "--print-config", env=env)
        assert result.returncode == 0, result.stderr[-3000:]
        configs[import_all] = result.stdout
    assert configs["0"] == configs["1"]


# Each package's public names, as its own __init__ defines them (the names it takes `from M import`), and every name
# of torch, os, typing and pickle (names the packages mostly lack: pickle, inspect and torch's compile caches ask every
# module for such names), each answer described by what it is; in one process first asked of the packages before their
# inits ran, in another after a plain import. The deferred process also says which unneeded modules were imported by
# the foreign names that no file under the package's folder spells out and that are not one of its submodules.
PROBE = r"""
import importlib, json, os, pathlib, pickle, re, sys, typing
import torch
from launcher.imports import deferred_inits, init_names
from tests.test_deferred_inits import unneeded
deferred = sys.argv[1] == "deferred"
if deferred:
    deferred_inits.install()
packages = {name: importlib.import_module(name) for name in sorted(deferred_inits.DEFERRED)}
foreign = sorted({name for module in (torch, os, typing, pickle) for name in dir(module) if not name.startswith("__")})

def described(value):
    return [type(value).__name__, getattr(value, "__module__", None),
            getattr(value, "__qualname__", getattr(value, "__name__", None))]

def words_of(package):
    folder = pathlib.Path(importlib.util.find_spec(package).origin).parent
    return {word for path in folder.rglob("*.py") for word in re.findall(r"\w+", path.read_text())}

words = {package: words_of(package) for package in packages}
asked = [(package, name) for package in packages for name in foreign]
# Names that no file under the package's folder spells (its `*` imports reach into subpackages), nor is a submodule:
# nothing there can bind them.
unbindable = {(p, n) for p, n in asked if n not in words[p] and not (
    init_names.spec_unimported(f"{p}.{n}"))}
seen = {f"{p}:{n}": described(getattr(packages[p], n, None)) for p, n in sorted(unbindable)}
imported_by_foreign = unneeded(set(sys.modules))
seen |= {f"{p}:{n}": described(getattr(packages[p], n, None)) for p, n in sorted(set(asked) - unbindable)}
for package, module in packages.items():
    named = init_names.bindings(importlib.util.find_spec(package).origin, package).taken
    for name in sorted(n for n in named if not n.startswith("_")):
        seen[f"{package}.{name}"] = described(getattr(module, name, None))
print(json.dumps({"seen": seen, "imported_by_foreign": imported_by_foreign}))
"""


def probe(mode: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_every_name_asked_of_a_deferred_package_is_what_its_init_makes_it_and_a_name_it_lacks_imports_nothing():
    """Or, where the plain import has no such name, the package's submodule of that name, imported when asked. One
    test for both, since the two probes take minutes."""
    deferred, plain = probe("deferred"), probe("plain")
    assert deferred["imported_by_foreign"] == []
    deferred, plain = deferred["seen"], plain["seen"]
    assert len([name for name in plain if ":" not in name]) > 100  # AutoBridge, the model providers, the recipes...
    differ = {name: (deferred.get(name), seen) for name, seen in plain.items() if deferred.get(name) != seen}
    submodule = {name: pair for name, pair in differ.items() if pair[1][0] == "NoneType" and pair[0][0] == "module"}
    assert {name: pair for name, pair in differ.items() if name not in submodule} == {}
    assert {name: pair for name, pair in submodule.items() if pair[0][2] != name.replace(":", ".")} == {}


# A rank's start: entrypoint.py imported as in a rank, then the root logger's level and handlers. Megatron-LM's
# training module configures the root logger as it loads (Megatron Bridge's "Pretrain failed on rank=" line goes
# through it), so the deferral must leave it be. Asked to, the rank then runs torch.compile and says which unneeded
# modules are imported: torch.compile keys its caches by pickling the graph, and pickle looks a function up in every
# module of sys.modules.
RANK = """
import json, logging, sys
compiles = sys.argv[1:] == ["compile"]
sys.argv = ["entrypoint.py"]
import entrypoint
root = logging.getLogger()
said = {"logging": [logging.getLevelName(root.level), [type(handler).__name__ for handler in root.handlers]]}
if compiles:
    import torch
    from tests.test_deferred_inits import unneeded
    twice = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2)
    assert twice(torch.ones(4)).shape == (4,)
    said["unneeded"] = unneeded(set(sys.modules))
print(json.dumps(said))
"""


def run_program(program: str, *args: str, import_all: str) -> subprocess.CompletedProcess[str]:
    """`python -c PROGRAM ARGS` in the checkout, with the packages' inits whole (IMPORT_ALL "1", as entrypoint.py
    reads SRUN_SH_IMPORT_ALL) or deferred ("0")."""
    return subprocess.run(
        [sys.executable, "-c", program, *args],
        cwd=REPO,
        env={**os.environ, "SRUN_SH_IMPORT_ALL": import_all},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def start_rank(import_all: str) -> subprocess.CompletedProcess[str]:
    """The rank with its inits deferred (SRUN_SH_IMPORT_ALL=0) also compiles; the other only starts."""
    return run_program(RANK, *(["compile"] if import_all == "0" else []), import_all=import_all)


def rank(once, import_all: str) -> dict:
    """What the rank said, its process started once a session for both tests below."""
    done = once(f"deferred-inits-rank-{import_all}", lambda: start_rank(import_all))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_torch_compile_in_a_rank_imports_none_of_the_unneeded_modules(once):
    assert rank(once, "0")["unneeded"] == []


def test_the_ranks_logging_is_the_same_with_the_inits_deferred_or_whole(once):
    assert rank(once, "0")["logging"] == rank(once, "1")["logging"]
