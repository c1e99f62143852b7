"""Package inits that run only when asked for: a rank imports the training code it runs, not every model there is.

`install()` (before the training stack's first import) puts a finder first on `sys.meta_path`. A package named in
DEFERRED is then created without running its `__init__.py`, so that importing one of its submodules loads that
submodule alone. A name asked of such a package is what its `__init__` would bind, read from the `__init__`'s
statements (launcher/imports/init_names.py): a name the `__init__` takes from one module, a module it imports or one of
its submodules is imported alone; a name it binds any other way runs the whole `__init__` there and then; a name it
cannot bind is one of its submodules or an AttributeError, as after a plain import. Importing a module in
NEEDS_EVERY_INIT first runs every deferred `__init__`, as a plain import would have; after `install(bridges_wait=True)`
those inits wait instead until `register_bridges(hf_path)` (before the recipe's configure() runs) imports the model
bridge that hf_path's architecture needs, or runs them all where launcher/imports/model_bridges.py cannot name it.
Nothing installed is changed.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence

from launcher.imports import init_names, model_bridges

# Whose __init__ imports much more than the packages' own training path uses: Megatron Bridge's imports every model
# bridge (and with them transformers, diffusers, scipy) to register them, and its MIMO data package's the Hugging Face
# provider (datasets, transformers' auto classes, accelerate) where a data loader only checks for the base provider's
# class; ModelOpt's imports every optimisation mode and its Hugging Face, diffusers and PEFT plugins.
DEFERRED = frozenset(
    {
        "megatron.bridge",
        "megatron.bridge.data",
        "megatron.bridge.data.builders",
        "megatron.bridge.data.megatron_mimo",
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
        found = init_names.bindings(self.__spec__.origin, self.__name__)
        if found is not None and found.may_bind(name):
            value = bound_without_running(self.__name__, name, found)
            if value is not None:
                return value
        elif init_names.spec_unimported(f"{self.__name__}.{name}") is not None:
            return importlib.import_module(f"{self.__name__}.{name}")  # the __init__ may have imported it on the way
        elif found is not None:
            # pickle, inspect and torch's compile caches ask every module in sys.modules for names it lacks
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        run_init(self)
        return getattr(self, name)


class DeferringFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Creates the DEFERRED packages as DeferredPackage, keeping each one's own loader to run its `__init__` later;
    from the first import of a NEEDS_EVERY_INIT module on, defers nothing and runs the waiting inits."""

    def __init__(self) -> None:
        self.loaders: dict[str, importlib.abc.Loader] = {}
        self.deferring = True
        self.bridges_wait = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in NEEDS_EVERY_INIT and self.deferring and not self.bridges_wait:
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


def install(bridges_wait: bool = False) -> None:
    FINDER.bridges_wait = bridges_wait
    if FINDER not in sys.meta_path:
        sys.meta_path.insert(0, FINDER)


def register_bridges(hf_path: str | None) -> None:
    """Ends the wait. Where AutoBridge was imported while the inits waited: import the model bridge of HF_PATH's
    architecture alone if AutoBridge's lookup then finds it as after a plain import, else run every waiting init.
    Each configure() of a process calls it: a second recipe may read another architecture."""
    FINDER.bridges_wait = False
    if not (FINDER.deferring and NEEDS_EVERY_INIT.intersection(sys.modules)):
        return
    architectures = model_bridges.plain_architectures(hf_path)
    modules = model_bridges.registering_modules(architectures)
    for module in modules or ():
        importlib.import_module(module)
    if modules is None or not model_bridges.found_alike(architectures):
        FINDER.deferring = False
        run_every_init()


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


def bound_without_running(module: str, name: str, found: init_names.Bindings) -> object | None:
    """NAME as MODULE's statements (FOUND) bind it, where one statement does and running MODULE is not needed to
    know what it binds: taken from one module, a module imported, a submodule, or from the last `*` import that can
    give it (followed to where that module takes it from); else None."""
    exports = [init_names.exported(starred) for starred in found.starred]
    if any(names is None for names in exports):
        return None
    starred = [starred for starred, names in zip(found.starred, exports, strict=True) if name in names]
    ways = found.ways(name)
    if ways == 0:
        return from_last_star(starred, name)
    if ways != 1 or starred:
        return None
    if name in found.taken and len(found.taken[name]) == 1:
        (source,) = found.taken[name]
        return taken_from(source, name, module)
    if name in found.modules:
        return module_imported(name, found.modules[name])
    if name in found.submodules:
        return importlib.import_module(f"{module}.{name}")
    return None


def module_imported(name: str, imports: set[str]) -> object | None:
    """What `import M` statements bind as NAME: the top package M's of `import M.SUB` (all of them loaded), or the M
    of `import M as NAME`; None where the statements bind NAME to different modules."""
    if all(imported.split(".")[0] == name for imported in imports):
        for imported in sorted(imports):
            importlib.import_module(imported)
        return sys.modules[name]
    if len(imports) != 1:
        return None
    return importlib.import_module(next(iter(imports)))


def from_last_star(starred: list[str], name: str) -> object | None:
    """NAME from the last of the `*` imports that binds it; one that fails to import (under a guard such as
    ModelOpt's import_plugin, or the `__init__` would fail) binds nothing."""
    for module in reversed(starred):
        try:
            return getattr(importlib.import_module(module), name)
        except ImportError:
            continue
    return None


def taken_from(module: str, name: str, package: str) -> object:
    """What `from MODULE import NAME` binds: MODULE's NAME, or its submodule NAME."""
    if module != package:
        source = importlib.import_module(module)
        if hasattr(source, name):
            return getattr(source, name)
    return importlib.import_module(f"{module}.{name}")
