"""Package inits that run only when asked for: a rank imports the training code it runs, not every model there is.

`install()` (before the training stack's first import) puts a finder first on `sys.meta_path`. A package named in
DEFERRED is then created without running its `__init__.py`, so that importing one of its submodules loads that
submodule alone. When code asks such a package for a name that is not one of its submodules, the name is looked up in
the `from MODULE import NAME` lines of the package's `__init__.py` and that module alone is imported; a name the
`__init__` makes any other way runs the whole `__init__` there and then. Importing a module in NEEDS_EVERY_INIT first
runs every deferred `__init__`, as a plain import would have. Nothing installed is changed.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence
from functools import cache
from pathlib import Path

# Whose __init__ imports much more than the packages' own training path uses: Megatron Bridge's imports every model
# bridge (and with them transformers, diffusers, scipy) to register them; ModelOpt's imports every optimisation mode
# and its Hugging Face, diffusers and PEFT plugins.
DEFERRED = frozenset(
    {
        "megatron.bridge",
        "megatron.bridge.data",
        "megatron.bridge.data.builders",
        "megatron.bridge.models",
        "megatron.bridge.models.conversion",
        "megatron.bridge.models.hf_pretrained",
        "megatron.bridge.recipes",
        "modelopt.torch",
        "modelopt.torch.distill.plugins",
        "modelopt.torch.opt.plugins",
        "modelopt.torch.quantization.plugins",
    }
)
# AutoBridge (Hugging Face conversion: a recipe's hf_path) finds a model's bridge among those that
# megatron.bridge.models' __init__ registers.
NEEDS_EVERY_INIT = frozenset({"megatron.bridge.models.conversion.auto_bridge"})


class DeferredPackage(types.ModuleType):
    """A package whose `__init__` has not run: a missing name is found without it where it can be."""

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        submodule = f"{self.__name__}.{name}"
        if importlib.util.find_spec(submodule) is not None:
            return importlib.import_module(submodule)
        source = source_of(name, self.__spec__.origin, self.__name__)
        if source is not None:
            return getattr(importlib.import_module(source), name)
        run_init(self)
        return getattr(self, name)


class DeferringFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Creates the DEFERRED packages as DeferredPackage, keeping each one's own loader to run its `__init__` later;
    from the first import of a NEEDS_EVERY_INIT module on, defers nothing and runs the waiting inits."""

    def __init__(self) -> None:
        self.loaders: dict[str, importlib.abc.Loader] = {}
        self.deferring = True

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in NEEDS_EVERY_INIT and self.deferring:
            self.deferring = False
            run_inits_above(fullname)
            run_every_init()
        if not self.deferring:
            run_inits_above(fullname)  # a package's init runs before its submodules load, as in a plain import
            return None
        if fullname not in DEFERRED or fullname in self.loaders:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            return None
        self.loaders[fullname] = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return DeferredPackage(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        """The import of the package itself: its `__init__` waits."""


FINDER = DeferringFinder()


def install() -> None:
    if FINDER not in sys.meta_path:
        sys.meta_path.insert(0, FINDER)


def run_init(package: types.ModuleType) -> None:
    """Run the package's own `__init__` into the module that already stands for it, once."""
    if type(package) is not DeferredPackage:
        return
    package.__class__ = types.ModuleType
    package.__spec__.loader = package.__loader__ = FINDER.loaders[package.__name__]
    package.__spec__.loader.exec_module(package)


def run_inits_above(fullname: str) -> None:
    """The waiting inits of the packages that hold a module, the outermost first."""
    parts = fullname.split(".")
    for depth in range(1, len(parts)):
        package = sys.modules.get(".".join(parts[:depth]))
        if package is not None:
            run_init(package)


def run_every_init() -> None:
    """Every waiting init of a package imported so far, the outer packages first, as a plain import has them."""
    for name in sorted(FINDER.loaders, key=lambda name: name.count(".")):
        package = sys.modules.get(name)
        if package is not None:
            run_init(package)


def source_of(name: str, init_file: str | None, package: str) -> str | None:
    """The module a package's `__init__.py` takes NAME from (`from M import NAME`, or `from M import *` where M
    defines NAME), or None."""
    if init_file is None:
        return None
    named, starred = imports_of(init_file, package)
    if name in named:
        return named[name]
    return next((module for module in starred if name in top_level_names(module)), None)


@cache
def imports_of(init_file: str, package: str) -> tuple[dict[str, str], list[str]]:
    """From the `from MODULE import ...` statements anywhere in a file: NAME -> MODULE, and the MODULEs taken with *."""
    named, starred = {}, []
    for node in ast.walk(ast.parse(Path(init_file).read_bytes())):
        if isinstance(node, ast.ImportFrom):
            module = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            for alias in node.names:
                if alias.name == "*":
                    starred.append(module)
                else:
                    named[alias.asname or alias.name] = module
    return named, starred


@cache
def top_level_names(module: str) -> frozenset[str]:
    """The names a module's file defines at its top level (functions, classes, assignments), read, not imported."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return frozenset()
    names = set()
    for node in ast.parse(Path(spec.origin).read_bytes()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(target.id for target in targets if isinstance(target, ast.Name))
    return frozenset(names)
