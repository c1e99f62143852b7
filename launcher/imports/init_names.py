"""What a module's file binds at its top level, read, not run: for each name, how the module gets it.

`bindings(file, package)` parses the file once and returns Bindings, or None where the file may bind names that its
statements do not spell out (a module `__getattr__`, `globals()`, `vars()`, `exec`). Only statements that run when
the module loads count: those of its functions and classes do not, but for their `global` names.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.machinery
import importlib.util
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

DYNAMIC_CALLS = frozenset({"globals", "vars", "exec"})


@dataclasses.dataclass
class Bindings:
    """NAME -> how the module binds it. A name bound more than one way is in several of these."""

    taken: dict[str, set[str]] = dataclasses.field(default_factory=dict)  # from MODULE import NAME: the MODULEs
    modules: dict[str, set[str]] = dataclasses.field(default_factory=dict)  # import M (as NAME): the Ms
    submodules: set[str] = dataclasses.field(default_factory=set)  # the package's submodules its imports load
    defined: set[str] = dataclasses.field(default_factory=set)  # def, class, assignment, for, with, except, global
    starred: list[str] = dataclasses.field(default_factory=list)  # from MODULE import *, in the file's order
    is_init: bool = False  # a package's __init__.py, whose imports of its submodules bind them
    all_names: list[str] | None = None  # __all__, where the file spells it out as a list of strings

    def ways(self, name: str) -> int:
        return (name in self.taken) + (name in self.modules) + (name in self.submodules) + (name in self.defined)

    def may_bind(self, name: str) -> bool:
        """Whether a statement binds NAME or one of the `*` imports may (True where what one binds is unknown)."""
        return bool(self.ways(name)) or any(names is None or name in names for names in map(exported, self.starred))


def loaded_statements(tree: ast.Module) -> Iterator[ast.AST]:
    """The nodes that run when the module loads, in the file's order: all but the bodies of its functions, classes
    and lambdas."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stack.extend(reversed(node.decorator_list))
        elif not isinstance(node, ast.Lambda):
            stack.extend(reversed(list(ast.iter_child_nodes(node))))  # in the file's order


@cache
def bindings(source_file: str, package: str) -> Bindings | None:
    """How the module in SOURCE_FILE (relative imports resolved against PACKAGE) binds each name."""
    tree = ast.parse(Path(source_file).read_bytes())
    found = Bindings(is_init=Path(source_file).name == "__init__.py")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in DYNAMIC_CALLS:
            return None
        if isinstance(node, ast.Global):
            found.defined.update(node.names)
    if not all(add_binding(found, node, package) for node in loaded_statements(tree)):
        return None
    return found


def add_binding(found: Bindings, node: ast.AST, package: str) -> bool:
    """Add what NODE binds; False where it binds names it does not spell out."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        found.defined.add(node.name)
        return node.name != "__getattr__"
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        found.defined.add(node.id)
    elif isinstance(node, ast.ExceptHandler) and node.name:
        found.defined.add(node.name)
    elif isinstance(node, ast.Import):
        for alias in node.names:
            found.modules.setdefault(alias.asname or alias.name.split(".")[0], set()).add(alias.name)
            add_submodule(found, alias.name, package)
    elif isinstance(node, ast.ImportFrom):
        add_from_import(found, node, package)
    elif isinstance(node, (ast.Assign, ast.AugAssign)) and "__all__" in assigned(node):
        spelled = strings(node.value)
        if spelled is None:
            return False
        found.all_names = [*(found.all_names or []), *spelled] if isinstance(node, ast.AugAssign) else spelled
    return True


def assigned(node: ast.Assign | ast.AugAssign) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {target.id for target in targets if isinstance(target, ast.Name)}


def strings(node: ast.expr) -> list[str] | None:
    """The strings of a list or tuple literal of strings, else None."""
    if not isinstance(node, (ast.List, ast.Tuple)):
        return None
    items = [item.value for item in node.elts if isinstance(item, ast.Constant) and isinstance(item.value, str)]
    return items if len(items) == len(node.elts) else None


def add_from_import(found: Bindings, node: ast.ImportFrom, package: str) -> None:
    module = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
    add_submodule(found, module, package)
    for alias in node.names:
        if alias.name == "*":
            found.starred.append(module)
        else:
            found.taken.setdefault(alias.asname or alias.name, set()).add(module)


def add_submodule(found: Bindings, module: str, package: str) -> None:
    """Importing PACKAGE.X... in PACKAGE's `__init__` binds X there."""
    if found.is_init and module.startswith(package + "."):
        found.submodules.add(module[len(package) + 1 :].split(".", maxsplit=1)[0])


@cache
def exported(module: str) -> frozenset[str] | None:
    """The names `from MODULE import *` binds: its __all__, else every public name it binds (an over-count), or None
    where that is unknown."""
    spec = spec_unimported(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    package = module if spec.submodule_search_locations else module.rpartition(".")[0]
    found = bindings(spec.origin, package)
    if found is None:
        return None
    if found.all_names is not None:
        return frozenset(found.all_names)
    names = {*found.taken, *found.modules, *found.submodules, *found.defined}
    for starred in found.starred:
        more = exported(starred)
        if more is None:
            return None
        names |= more
    return frozenset(name for name in names if not name.startswith("_"))


def spec_unimported(module: str) -> importlib.machinery.ModuleSpec | None:
    """A module's spec found on disk, from the nearest package already imported, without importing the packages
    between (importlib.util.find_spec would run their inits)."""
    parts = module.split(".")
    depth = next(d for d in range(len(parts) - 1, -1, -1) if d == 0 or ".".join(parts[:d]) in sys.modules)
    path = getattr(sys.modules[".".join(parts[:depth])], "__path__", None) if depth else None
    spec = None
    for end in range(depth + 1, len(parts) + 1):
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:end]), path)
        if spec is None:
            return None
        path = spec.submodule_search_locations
    return spec
