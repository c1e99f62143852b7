"""launcher/imports/deferred_names.py: the installed Megatron Bridge and ModelOpt run with the names a GPT pretrain
never calls postponed, every shipped recipe resolves the same config as with a plain import, and the first use of a
postponed name gives the process a plain import's modules and effects; for programs
hypothesis writes, every name the module's uses allow to wait behaves as the real name would."""

import ast
import builtins
import importlib
import importlib.util
import json
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.imports import deferred_names
from tests import hf_models
from tests.test_deferred_inits import assert_same_config, run_program

REPO = Path(__file__).resolve().parent.parent

# A rank's imports with the names postponed, then what a GPT pretrain does not do: an SFT source's load_dataset on a
# local file, and isinstance against the distillation plugin's TensorQuantizer before and after ModelOpt's
# quantization is imported.
FIRST_USE = r"""
import json, sys
from launcher.imports import deferred_inits, deferred_names
deferred_inits.install(bridges_wait=True)
deferred_names.install()
import torch
from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.gpt_step import forward_step
said = {"before": sorted(p for p in ("datasets", "modelopt.torch.quantization", "transformers.processing_utils",
                                     "megatron.energon") if p in sys.modules)}
plugin = sys.modules["modelopt.torch.distill.plugins.megatron"]
said["isinstance before"] = isinstance(torch.nn.Linear(2, 2), plugin.TensorQuantizer)
said["imported by isinstance"] = "modelopt.torch.quantization" in sys.modules
hf = sys.modules["megatron.bridge.data.sources.hf"]
rows = hf.load_dataset("json", data_files=sys.argv[1], split="train")
said["rows"] = [dict(row) for row in rows]
import datasets
from modelopt.torch.quantization.nn import TensorQuantizer
said["bound"] = {
    "load_dataset": hf.load_dataset is datasets.load_dataset,
    "GPTSFTDataset": sys.modules["megatron.bridge.data.builders.gpt_sft"].GPTSFTDataset.__module__,
    "TensorQuantizer": plugin.TensorQuantizer is TensorQuantizer,
    "AutoProcessor": type(sys.modules["megatron.bridge.data.builders.mock_vlm_sft"].AutoProcessor).__name__,
}
said["gpt_sft patched datasets"] = datasets.builder.has_sufficient_disk_space.__module__
said["isinstance after"] = isinstance(TensorQuantizer(), plugin.TensorQuantizer)
said["postponed left"] = len(deferred_names.STATE.postponed)
print(json.dumps(said))
"""


def what_it_says(program: str, *args: str) -> dict:
    """The JSON line a program that installs the postponing itself prints last (`python -c PROGRAM ARGS`)."""
    done = run_program(program, *args, import_all="0")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_first_use_of_a_postponed_name_imports_every_postponed_module_with_its_effects(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"text": "a"}\n{"text": "b"}\n')
    said = what_it_says(FIRST_USE, str(data))
    assert said["before"] == []
    assert said["isinstance before"] is False
    assert said["imported by isinstance"] is False
    assert said["rows"] == [{"text": "a"}, {"text": "b"}]
    assert said["bound"] == {
        "load_dataset": True,
        "GPTSFTDataset": "megatron.bridge.data.datasets.gpt_sft",
        "TensorQuantizer": True,
        "AutoProcessor": "type",
    }
    assert said["gpt_sft patched datasets"] == "megatron.bridge.data.datasets.gpt_sft"  # as at a plain import
    assert said["isinstance after"] is True
    assert said["postponed left"] == 0


@pytest.mark.parametrize("recipe", sorted(hf_models.RECIPE_SHAPES))
def test_every_shipped_recipe_resolves_the_same_config_postponed_or_whole(run_entrypoint, hf_dir, recipe):
    # with the package inits deferred too, and of the model bridges only hf_path's (DeepSeek V2's bridge registers its
    # architecture by name, which AutoBridge looks up by transformers' class)
    shape = hf_models.RECIPE_SHAPES[recipe]
    arguments = [f"hf_path={hf_dir(shape)}"] if shape else []
    assert_same_config(run_entrypoint, str(REPO / "recipes" / f"{recipe}.py"), *arguments)


# A rank's --check, then the syntax trees alive in the process (gc sees every tracked object).
TREES_LEFT = r"""
import ast, contextlib, gc, io, sys
import entrypoint
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    assert entrypoint.main([sys.argv[1], "--check"]) == 0
gc.collect()
print(sum(type(o).__module__ == "ast" for o in gc.get_objects()))
"""


def test_a_rank_keeps_no_more_syntax_trees_than_a_plain_import_leaves():
    """The files read to postpone names are not kept parsed: a full garbage collection, which Megatron-FSDP's set-up
    and Megatron Bridge's training loop run, walks every object the rank holds."""
    trees = {}
    for import_all in ("1", "0"):
        done = run_program(TREES_LEFT, str(REPO / "recipes" / "tiny_gpt_pretrain.py"), import_all=import_all)
        assert done.returncode == 0, done.stderr[-3000:]
        trees[import_all] = int(done.stdout.split()[-1])
    assert trees["0"] <= trees["1"], f"syntax tree nodes alive, postponed {trees['0']}, plain import {trees['1']}"


# Programs hypothesis writes: a module imports a class or a function from a source module nothing imported yet, uses
# it at its top and in a function in ways drawn from USES, and the function returns what each use saw. The same
# program runs as a plain module and as one of deferred_names' importers, each with its own fresh copy of the source.
SOURCE = """
class Thing:
    x = 1
    def __init__(self, v=0):
        self.v = v
    def __repr__(self):
        return f"Thing({self.v})"
    @classmethod
    def make(cls):
        return cls(5)

def helper(*args):
    return len(args)
"""
# Uses of A (the imported name): a statement appending what it saw to `seen`, the imported names it is written for,
# and what a stand-in does with it: answers it by the real name ("resolves"), answers it without ("checks": isinstance
# before the source is imported), or cannot answer it (the module's uses then keep the name from waiting).
BOTH, CLASS = ("Thing", "helper"), ("Thing",)
USES = {
    "seen.append(A.make().v)": (CLASS, "resolves"),
    "seen.append(A.x)": (CLASS, "resolves"),
    "seen.append(A(3))": (BOTH, "resolves"),
    "seen.append(isinstance(1, A))": (CLASS, "checks"),
    "seen.append(isinstance(seen, (int, A)))": (CLASS, "checks"),
    "seen.append(issubclass(bool, A))": (CLASS, "checks"),
    "seen.append(A.__name__)": (BOTH, "unanswered"),
    "seen.append(A is A)": (BOTH, "unanswered"),
    "seen.append(A == A)": (BOTH, "unanswered"),
    "seen.append(len(repr(A)) > 0)": (BOTH, "unanswered"),
    "seen.append(isinstance(A, type))": (BOTH, "unanswered"),
    "seen.append([A][0].__qualname__)": (BOTH, "unanswered"),
    "B = A\n    seen.append(B(1))": (BOTH, "unanswered"),
    "class Sub(A):\n        pass\n    seen.append(Sub.__mro__[1].__name__)": (CLASS, "unanswered"),
    "try:\n        raise ValueError\n    except A:\n        seen.append('A')\n    except Exception as e:\n"
    "        seen.append(type(e).__name__)": (BOTH, "unanswered"),
}


def uses_of(name: str) -> st.SearchStrategy[list[str]]:
    return st.lists(st.sampled_from(sorted(use for use, (names, _) in USES.items() if name in names)), max_size=3)


# What the programs' uses raise: a class they cannot subclass or catch, a name they cannot compare
RAISED = (TypeError, AttributeError, NameError)


def program(source: str, name: str, top: list[str], inside: list[str]) -> str:
    lines = [f"from {source} import {name} as A", "seen = []"]
    lines += [f"if True:\n    {use}" for use in top]  # each top-level use, indented as in the function
    lines += ["def run():"]
    lines += [f"    {use}" for use in inside] or ["    pass"]
    lines += ["    return seen"]
    return "\n".join(lines) + "\n"


def outcome(run) -> list[object]:
    """What the module saw, each value by its repr (the two runs' classes are different objects)."""
    try:
        return [repr(value) if not isinstance(value, (bool, int, str)) else value for value in run()]
    except RAISED as error:
        return [f"raised {type(error).__name__}"]


def fresh_source(folder: Path) -> str:
    name = f"deferred_source_{uuid.uuid4().hex}"
    (folder / f"{name}.py").write_text(SOURCE)
    return name


def load(folder: Path, text: str, watched: bool) -> object:
    """The program as a module: its `from ... import` through deferred_names' __import__ where WATCHED."""
    name = f"deferred_importer_{uuid.uuid4().hex}"
    path = folder / f"{name}.py"
    path.write_text(text)
    module = type(sys)(name)
    module.__file__ = str(path)
    if watched:  # its own __import__, as install() makes the process's
        module.__dict__["__builtins__"] = {**vars(builtins), "__import__": deferred_names.watching_import}
    try:
        exec(compile(text, str(path), "exec"), module.__dict__)
    except RAISED as error:
        raised = [f"raised {type(error).__name__} at the top"]
        return lambda: raised
    return module.run


@contextmanager
def postponing(source: str, name: str) -> Iterator[None]:
    """deferred_names with NAME of SOURCE in its table and nothing postponed yet; the process's own state after."""
    state, table, process_import = deferred_names.STATE, deferred_names.DEFERRED, builtins.__import__
    deferred_names.STATE = deferred_names.State()
    deferred_names.DEFERRED = {**table, source: frozenset({name})}
    try:
        yield
    finally:  # another test of this process may have imported entrypoint.py, which installs watching_import
        deferred_names.STATE, deferred_names.DEFERRED, builtins.__import__ = state, table, process_import


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("deferred-names")
    sys.path.insert(0, str(path))
    yield path
    sys.path.remove(str(path))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), name=st.sampled_from(BOTH))
def test_a_name_postponed_or_not_behaves_as_the_real_name(folder, data, name):
    top, inside = data.draw(uses_of(name), label="top"), data.draw(uses_of(name), label="inside")
    plain_source, watched_source = fresh_source(folder), fresh_source(folder)
    with postponing(watched_source, name):
        plain = outcome(load(folder, program(plain_source, name, top, inside), watched=False))
        watched_run = load(folder, program(watched_source, name, top, inside), watched=True)
        waited = watched_source not in sys.modules
        watched = outcome(watched_run)
    assert watched == [
        value.replace(plain_source, watched_source) if isinstance(value, str) else value for value in plain
    ]
    kinds = [USES[use][1] for use in top + inside]
    assert waited == ("unanswered" not in kinds and all(USES[use][1] == "checks" for use in top))


def test_a_name_the_source_already_bound_is_the_real_one(folder):
    source = fresh_source(folder)
    importlib.import_module(source)
    with postponing(source, "Thing"):
        run = load(folder, program(source, "Thing", [], ["seen.append(A.make().v)"]), watched=True)
    assert run.__globals__["A"] is sys.modules[source].Thing


# transformers' object detection losses import scipy's and transformers' own functions, the latter relatively
# (`from ..image_transforms import`): both wait, and the first call gets scipy's answer.
RELATIVE = r"""
import json, sys
import numpy
from launcher.imports import deferred_names
deferred_names.install()
from transformers.loss import loss_for_object_detection as detection
said = {
    "waiting": [type(detection.linear_sum_assignment).__name__, type(detection.center_to_corners_format).__name__],
    "imported": sorted(m for m in ("scipy.optimize", "transformers.image_transforms") if m in sys.modules),
}
rows, columns = detection.linear_sum_assignment(numpy.array([[4.0, 1.0], [2.0, 0.0]]))
import scipy.optimize, transformers.image_transforms
said["assignment"] = [rows.tolist(), columns.tolist()]
said["real"] = [
    detection.linear_sum_assignment is scipy.optimize.linear_sum_assignment,
    detection.center_to_corners_format is transformers.image_transforms.center_to_corners_format,
]
print(json.dumps(said))
"""


def test_names_a_relative_import_names_wait_too_and_the_first_call_gets_the_real_answer():
    assert what_it_says(RELATIVE) == {
        "waiting": ["StandIn", "StandIn"],
        "imported": [],
        "assignment": [[0, 1], [1, 0]],
        "real": [True, True],
    }


# transformers' assisted generation (which its auto model factory imports, so every hf_path rank) binds scikit-learn's
# roc_curve at its top: it waits, with none of scikit-learn, scipy or pandas imported, and the first call gets
# scikit-learn's answer on a labelled score list that scikit-learn's own documentation uses.
ASSISTED = r"""
import json, sys
from launcher.imports import deferred_names
deferred_names.install()
from transformers.generation import candidate_generator
said = {
    "waiting": type(candidate_generator.roc_curve).__name__,
    "imported": sorted(m for m in ("sklearn", "scipy", "pandas") if m in sys.modules),
}
curve = candidate_generator.roc_curve([1, 1, 2, 2], [0.1, 0.4, 0.35, 0.8], pos_label=2)
import sklearn.metrics
said["curve"] = [values.tolist() for values in curve]
said["real"] = candidate_generator.roc_curve is sklearn.metrics.roc_curve
print(json.dumps(said))
"""


def test_assisted_generations_roc_curve_waits_and_the_first_call_gets_scikit_learns_answer():
    assert what_it_says(ASSISTED) == {
        "waiting": "StandIn",
        "imported": [],
        "curve": [[0.0, 0.0, 0.5, 0.5, 1.0], [0.0, 0.5, 0.5, 1.0, 1.0], [float("inf"), 0.8, 0.4, 0.35, 0.1]],
        "real": True,
    }


# Where the installed files that import from a postponed source are: Megatron Bridge, megatron.core and Megatron-LM's
# training package, ModelOpt's plugins, transformers' own modules, losses and generation utilities (not its 400-odd
# model folders, which a GPT pretrain's rank never imports).
SCANNED = ("megatron", "modelopt", "transformers")
NOT_SCANNED = ("transformers/models/",)


def deferred_imports_installed() -> list[tuple[str, str, str]]:
    """(file, source, package) of every installed file of SCANNED that imports a postponed name, as the rank's
    `__import__` meets them (a relative import resolved against the file's package)."""
    found = []
    roots = [Path(place) for top in SCANNED for place in importlib.util.find_spec(top).submodule_search_locations]
    for root in roots:  # megatron is a namespace package: megatron-core's and Megatron Bridge's folders
        for file in sorted(root.rglob("*.py")):
            relative = file.relative_to(root.parent)
            if any(part in relative.as_posix() for part in NOT_SCANNED):
                continue
            text = file.read_bytes()
            if not any(name.encode() in text for names in deferred_names.DEFERRED.values() for name in names):
                continue
            package = ".".join(relative.parts[:-1])  # a package's __init__.py, like its modules, is in that package
            sources = {
                deferred_names.imported_from(node, package)
                for node in ast.walk(ast.parse(text))
                if isinstance(node, ast.ImportFrom)
            }
            found += [(str(file), source, package) for source in sorted(sources & deferred_names.DEFERRED.keys())]
    return found


def read_whole(file: str, source: str, package: str) -> deferred_names.FromSource:
    """from_source's answer, read from every node ast.walk gives and every node's parent."""
    nodes = list(ast.walk(ast.parse(Path(file).read_bytes())))
    parents = {child: node for node in nodes for child in ast.iter_child_nodes(node)}
    imported = deferred_names.aliases(nodes, source, package)
    return deferred_names.FromSource(imported, deferred_names.uses_answered(nodes, parents, imported, source, package))


def test_one_pass_over_each_installed_file_reads_what_ast_walk_and_every_parent_read():
    """from_source walks a file's tree once (every further walk of a large module cost as much as parsing it: 0.25 s
    of the Llama recipe's 7 s --check on 2 cores). On every installed file that imports a postponed name, it reads
    the same aliases and the same answered names as every node ast.walk gives, with every node's parent."""
    found = deferred_imports_installed()
    assert len(found) >= 30, found  # Megatron Bridge's builders and wrappers, transformers' losses, ModelOpt's plugin
    assert any(deferred_names.from_source(*one).answered for one in found)  # some names do wait
    for one in found:
        assert deferred_names.from_source(*one) == read_whole(*one), one
