"""Names that the training stack's modules import at their top for an SFT, a VLM, a distillation, a refit, an object
detection loss or assisted generation, from packages a GPT pretrain never calls (transformers' processors and auto
tokenizer, datasets, Megatron Energon, ModelOpt's quantization, megatron.core's resharding, scipy, scikit-learn): each
is bound to a stand-in until the first use of any of them, which then runs every import so postponed, in the order they
were met.

`install()` (before the training stack's first import) makes `watching_import` the process's `__import__`. A
`from SOURCE import NAME`, for a NAME of DEFERRED[SOURCE] that SOURCE has not bound yet, then binds a stand-in where the
importing module's file uses NAME only in ways the stand-in answers as NAME would (`uses_answered`): its attributes, a
call, or as the class of an `isinstance`/`issubclass`. The first such use imports every postponed SOURCE, binds the real
names in place of the stand-ins and gives `__import__` back: the process is then as a plain import left it, with the
postponed modules' own effects (Megatron Bridge's `data.datasets.gpt_sft` patches `datasets` as it loads). Until then
`isinstance(x, stand_in)` is False, as it is for every x: no instance of a class exists before its module is imported.
Nothing installed is changed.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import sys
import threading
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from launcher.imports import init_names

# SOURCE -> its NAMEs that a GPT pretrain never calls (bench/results/startup.md, "Names postponed"); what importing
# SOURCE brings, and who imports the names
DEFERRED: Mapping[str, frozenset[str]] = {
    # image and video processing, torchvision; the auto tokenizer's model factory, whose generation utilities import
    # scikit-learn (and scipy, pandas) where it is installed: Megatron Bridge's dataset builders and HF model wrapper
    "transformers": frozenset({"AutoImageProcessor", "AutoProcessor", "AutoTokenizer", "Qwen3VLProcessor"}),
    # scipy, torchvision: transformers' object detection losses, which its modeling_utils imports
    "scipy.optimize": frozenset({"linear_sum_assignment"}),
    # scikit-learn where it is installed, and with it most of scipy and pandas (3.2 s of -X importtime's count for the
    # Llama recipe's rank on one H100): transformers' assisted generation, which its auto model factory imports, so
    # every hf_path recipe
    "sklearn.metrics": frozenset({"roc_curve"}),
    "transformers.image_transforms": frozenset({"center_to_corners_format"}),
    # pandas, pyarrow: Megatron Bridge's Hugging Face dataset source
    "datasets": frozenset({"concatenate_datasets", "load_dataset"}),
    # datasets, which it patches as it loads: Megatron Bridge's SFT dataset builder
    "megatron.bridge.data.datasets.gpt_sft": frozenset({"GPTSFTChatDataset", "GPTSFTDataset", "get_dataset_root"}),
    # Megatron Energon: Megatron Bridge's Energon dataset builder
    "megatron.bridge.data.energon.base_energon_datamodule": frozenset({"EnergonMultiModalDataModule"}),
    # every quantization mode, scipy.stats: ModelOpt's distillation plugin (for an isinstance in a distillation)
    "modelopt.torch.quantization.nn": frozenset({"TensorQuantizer"}),
    # the resharding package (NVSHMEM copy service, cuda.core): Megatron-LM's training loop, for reinforcement
    # learning's refit of an inference model
    "megatron.core.resharding.refit": frozenset({"swap_model_weights"}),
}

# A relative import is resolved only where its last part is one of theirs
LAST_PARTS = frozenset(source.rpartition(".")[2] for source in DEFERRED)
PLAIN_IMPORT = builtins.__import__  # as this module found it; install() takes the one of its time


@dataclass
class Postponed:
    """One name a module's `from SOURCE import NAME (as ALIAS)` bound to STAND_IN, in its NAMESPACE."""

    source: str
    name: str
    namespace: dict[str, object]
    alias: str
    stand_in: StandIn


class State:
    """What was postponed, in the order met; from the first use of a stand-in on, nothing more is."""

    def __init__(self) -> None:
        self.postponed: list[Postponed] = []
        self.deferring = True
        self.plain_import = PLAIN_IMPORT
        self.lock = threading.Lock()  # guards the list only: imports take their own locks


STATE = State()


class StandIn:
    """What a postponed name is bound to until it is first used."""

    def __init__(self, source: str, name: str) -> None:
        self.source, self.name = source, name

    def real(self) -> object:
        import_every_postponed()
        return getattr(importlib.import_module(self.source), self.name)

    def __getattr__(self, attribute: str) -> object:
        if attribute.startswith("__"):  # copy, pickle and inspect probe for these; the module's code does not use them
            raise AttributeError(attribute)
        return getattr(self.real(), attribute)

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self.real()(*args, **kwargs)

    def __instancecheck__(self, instance: object) -> bool:
        return self.source in sys.modules and isinstance(instance, self.real())

    def __subclasscheck__(self, subclass: type) -> bool:
        return self.source in sys.modules and issubclass(subclass, self.real())

    def __repr__(self) -> str:
        return f"<{self.source}.{self.name}, not imported yet>"


def import_every_postponed() -> None:
    """Each postponed import, in the order met, and the real names bound in place of the stand-ins."""
    STATE.deferring = False
    if builtins.__import__ is watching_import:
        builtins.__import__ = STATE.plain_import
    while True:
        with STATE.lock:
            if not STATE.postponed:
                return
            one = STATE.postponed.pop(0)
        real = getattr(importlib.import_module(one.source), one.name)
        if one.namespace.get(one.alias) is one.stand_in:
            one.namespace[one.alias] = real


class SourceView(types.ModuleType):
    """What `__import__` hands a `from SOURCE import ...` with some names postponed: their stand-ins, and the other
    names from SOURCE itself."""

    def __init__(self, source: str, stand_ins: dict[str, StandIn], module: types.ModuleType | None) -> None:
        super().__init__(source)
        self.__dict__.update(stand_ins)
        self._module = module

    def __getattr__(self, name: str) -> object:
        if self._module is None:
            raise AttributeError(name)
        return getattr(self._module, name)


def watching_import(
    name: str,
    globals: dict[str, object] | None = None,
    locals: Mapping[str, object] | None = None,
    fromlist: Sequence[str] = (),
    level: int = 0,
) -> types.ModuleType:
    """`__import__` that postpones the names DEFERRED lists, where the importing module's uses allow."""
    source = name if level == 0 else relative_source(name, globals, level)
    postponed = postponable(source, globals, fromlist) if source in DEFERRED else []
    if not postponed:
        return STATE.plain_import(name, globals, locals, fromlist, level)
    rest = [n for n in fromlist if n not in postponed]
    module = STATE.plain_import(name, globals, locals, rest, level) if rest else None
    stand_ins = {n: StandIn(source, n) for n in postponed}
    with STATE.lock:
        for alias, imported in from_source(str(globals["__file__"]), source, package_of(globals)).aliases.items():
            if imported in stand_ins:
                STATE.postponed.append(Postponed(source, imported, globals, alias, stand_ins[imported]))
    return SourceView(source, stand_ins, module)


def relative_source(name: str, namespace: dict[str, object] | None, level: int) -> str | None:
    """The module a relative `from ..NAME import` names, where it may be one of DEFERRED (else None, at once)."""
    return absolute(name, level, package_of(namespace)) if name.rpartition(".")[2] in LAST_PARTS else None


def absolute(name: str, level: int, package: str | None) -> str | None:
    """The module `from` LEVEL dots and NAME names in PACKAGE; None where it cannot be resolved (beyond the top-level
    package, or no package: the plain import says so)."""
    try:
        return importlib.util.resolve_name("." * level + name, package)
    except (ImportError, ValueError):
        return None


def package_of(namespace: dict[str, object] | None) -> str | None:
    package = (namespace or {}).get("__package__")
    return package if isinstance(package, str) else None


def postponable(source: str | None, namespace: dict[str, object] | None, fromlist: Sequence[str]) -> list[str]:
    """The names of a `from SOURCE import FROMLIST`, run in the module of NAMESPACE, that can wait."""
    file = (namespace or {}).get("__file__")
    if not (fromlist and isinstance(file, str) and file.endswith(".py") and STATE.deferring and findable(source)):
        return []
    answered_names = DEFERRED[source] & from_source(file, source, package_of(namespace)).answered
    return [name for name in fromlist if name in answered_names and not bound(source, name)]


def findable(source: str) -> bool:
    """Whether SOURCE is installed (found without running any package init), so that its import would not fail: an
    import in a `try` that a missing package fails must still fail there."""
    return source in sys.modules or init_names.spec_unimported(source) is not None


def bound(source: str, name: str) -> bool:
    """Whether SOURCE is loaded with NAME bound: postponing it would save nothing."""
    module = sys.modules.get(source)
    return module is not None and name in vars(module)


def install() -> None:
    if builtins.__import__ is not watching_import:
        STATE.plain_import = builtins.__import__
        builtins.__import__ = watching_import


@dataclass(frozen=True)
class FromSource:
    """What a file imports from SOURCE, as the postponing needs it."""

    aliases: dict[str, str]  # ALIAS -> NAME of its `from SOURCE import NAME as ALIAS` statements
    answered: frozenset[str]  # the NAMEs whose every use in the file a stand-in answers (`uses_answered`)


@cache
def from_source(source_file: str, source: str, package: str | None) -> FromSource:
    """What the file imports from SOURCE (a relative import resolved against PACKAGE). Its syntax tree is not kept:
    that of a large module is some 10^5 objects, which every full garbage collection of the rank would walk."""
    nodes, parents = tree_nodes(ast.parse(Path(source_file).read_bytes()))
    imported = aliases(nodes, source, package)
    return FromSource(imported, uses_answered(nodes, parents, imported, source, package))


def tree_nodes(tree: ast.Module) -> tuple[list[ast.AST], dict[ast.AST, ast.AST]]:
    """Every node of TREE, and the parent of each name and tuple (what `answered` asks about), in one pass: each
    further pass over a large module's tree costs as much as parsing it."""
    nodes: list[ast.AST] = [tree]
    parents: dict[ast.AST, ast.AST] = {}
    for node in nodes:  # the list grows as the loop reads it: every node once, breadth first
        for child in ast.iter_child_nodes(node):
            nodes.append(child)
            if isinstance(child, (ast.Name, ast.Tuple)):
                parents[child] = node
    return nodes, parents


def aliases(nodes: list[ast.AST], source: str, package: str | None) -> dict[str, str]:
    """ALIAS -> NAME of the file's `from SOURCE import NAME as ALIAS` statements (top level or not; a relative one
    resolved against PACKAGE)."""
    return {
        alias.asname or alias.name: alias.name
        for node in nodes
        if isinstance(node, ast.ImportFrom) and imported_from(node, package) == source
        for alias in node.names
    }


def imported_from(node: ast.ImportFrom, package: str | None) -> str | None:
    """The module a `from ... import` statement names, a relative one resolved against PACKAGE."""
    return node.module if node.level == 0 else absolute(node.module or "", node.level, package)


def uses_answered(
    nodes: list[ast.AST], parents: dict[ast.AST, ast.AST], imported: dict[str, str], source: str, package: str | None
) -> frozenset[str]:
    """The NAMEs the file imports from SOURCE (IMPORTED: ALIAS -> NAME) whose every use a stand-in answers as NAME
    would: `ALIAS.attribute`, `ALIAS(...)`, `isinstance(x, ALIAS)` or `issubclass(x, ALIAS)` (alone or in a tuple). A
    NAME bound another way too, used any other way (compared, passed on, subclassed, caught, in an annotation), or in
    `__all__` is not."""
    unanswered = set(spelled_in_all(nodes)) | set(bound_otherwise(nodes, source, package))
    for node in nodes:
        if isinstance(node, ast.Name) and node.id in imported and not answered(node, parents):
            unanswered.add(node.id)
    return frozenset(imported.values()) - {imported[alias] for alias in unanswered if alias in imported}


def answered(node: ast.Name, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether this use of a name is one a stand-in answers as the name would."""
    parent = parents.get(node)
    if isinstance(parent, ast.Attribute):
        return isinstance(parent.ctx, ast.Load) and not parent.attr.startswith("__")
    if isinstance(parent, ast.Call) and parent.func is node:
        return True
    checked = parent if isinstance(parent, ast.Tuple) and isinstance(parent.ctx, ast.Load) else node
    call = parents.get(checked)
    return (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id in ("isinstance", "issubclass")
        and len(call.args) == 2  # the object, the class
        and not call.keywords
        and call.args[1] is checked
    )


def spelled_in_all(nodes: list[ast.AST]) -> list[str]:
    """The strings of every `__all__ = [...]` (or `+=`) in the file: another module's `*` import takes those."""
    return [
        element.value
        for node in nodes
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in assigned(node))
        and isinstance(node.value, (ast.List, ast.Tuple))
        for element in node.value.elts
        if isinstance(element, ast.Constant) and isinstance(element.value, str)
    ]


def assigned(node: ast.Assign | ast.AugAssign | ast.AnnAssign) -> list[ast.expr]:
    return node.targets if isinstance(node, ast.Assign) else [node.target]


def bound_otherwise(nodes: list[ast.AST], source: str, package: str | None) -> list[str]:
    """Names the file binds other than by `from SOURCE import`: other imports, definitions, parameters, `global`."""
    names: list[str] = []
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not (
            isinstance(node, ast.ImportFrom) and imported_from(node, package) == source
        ):
            names.extend((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.arg):
            names.append(node.arg)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.extend(node.names)
    return names
