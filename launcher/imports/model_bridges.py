"""Which Megatron Bridge module registers the model bridge of a Hugging Face model folder, read, not run.

`plain_architectures(hf_path)` reads the architectures of a model folder's config.json; none where the folder has no
plain config.json, an `auto_map` (custom model code that Megatron Bridge's modules register with transformers) or an
architecture that Megatron Bridge renames. `registering_modules(architectures)` gives the modules to import so that
AutoBridge finds the bridge it would find after every model bridge was imported, or None where that cannot be known
without importing them all: no architectures, or one that no module or more than one registers, or one registered
other than by the decorator of a class at a module's top level (the only registration that importing the module
makes). Once they are imported, `found_alike(architectures)` says whether AutoBridge's lookup of each architecture
finds the bridge that it finds with every bridge registered: the lookup is the registry's own key, or a class that
no registered name could match but by its own name.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path

from launcher.imports import init_names

# The subpackages of megatron.bridge whose model bridges register themselves with this decorator.
BRIDGE_TREES = ("models", "diffusion")
# Architectures AutoBridge reads under another name (auto_bridge.HF_ARCHITECTURE_ALIASES, megatron-bridge 0.6.2).
RENAMED = frozenset({"Qwen2_5OmniModel"})


def registering_modules(architectures: list[str]) -> list[str] | None:
    """The module registering each of ARCHITECTURES, or None (see the module's docstring)."""
    if not architectures:
        return None
    found = registrations(frozenset(architectures))
    modules = [found.get(name) for name in architectures]
    if any(module is None for module in modules):
        return None
    return sorted(set(modules))


def plain_architectures(hf_path: str | None) -> list[str]:
    """The architectures a local Hugging Face folder names, where no custom code or renaming comes with them."""
    config_file = Path(hf_path) / "config.json" if hf_path else None
    if config_file is None or not config_file.is_file():
        return []
    try:
        config = json.loads(config_file.read_bytes())
    except (ValueError, OSError):
        return []
    if not isinstance(config, dict) or "auto_map" in config:
        return []
    architectures = config.get("architectures")
    if not isinstance(architectures, list):
        return []
    if not all(isinstance(name, str) for name in architectures) or RENAMED.intersection(architectures):
        return []
    return architectures


def found_alike(architectures: list[str]) -> bool:
    """Whether AutoBridge's lookup of each of ARCHITECTURES finds the bridge it would find with every bridge
    registered (see looked_up_alike)."""
    import transformers
    from megatron.bridge.models.conversion import model_bridge

    registry = model_bridge.get_model_bridge._exact_types
    return all(looked_up_alike(getattr(transformers, name, name), name, registry) for name in architectures)


def looked_up_alike(key: object, name: str, registry: Mapping[object, object]) -> bool:
    """KEY is how AutoBridge looks NAME up: the transformers class of that name, else the name. Registering more
    bridges cannot change what the lookup finds where KEY is a key of the registry, or where it is a class whose name
    is registered and none of whose base classes has a name any bridge registers: the lookup tries the key, then the
    registered classes KEY derives from, then the registered name equal to KEY's (registrations() holds it once)."""
    if key in registry:
        return True
    if not isinstance(key, type) or name not in registry:
        return False
    return {base.__name__ for base in key.__mro__[1:]}.isdisjoint(registrations())


@cache
def registrations(names: frozenset[str] | None = None) -> dict[str, str | None]:
    """Architecture (of NAMES, or any) -> the module whose top-level class decorator registers it; None where that is
    not the only registration of the name."""
    found: dict[str, str | None] = {}
    for module, source in registering_calls(names):
        name, at_top = source
        found[name] = module if at_top and name not in found else None
    return {name: module for name, module in found.items() if names is None or name in names}


def registering_calls(names: frozenset[str] | None) -> Iterator[tuple[str, tuple[str, bool]]]:
    """(module, (architecture, registered at load time)) for every `register_bridge(source=...)` in the trees, of the
    files that spell one of NAMES where they are given (the others cannot register those)."""
    top = Path(init_names.spec_unimported("megatron.bridge").origin).parent  # not imported: it imports every bridge
    for path in sorted(path for tree in BRIDGE_TREES for path in (top / tree).rglob("*.py")):
        text = path.read_bytes()
        if b"register_bridge(" in text and (names is None or any(name.encode() in text for name in names)):
            module = ".".join(("megatron.bridge", *path.relative_to(top).with_suffix("").parts))
            for source in sources(ast.parse(text)):
                yield module, source


def sources(tree: ast.Module) -> Iterator[tuple[str, bool]]:
    """The architecture each `register_bridge(source=...)` call of a module names, and whether the call decorates a
    class at the module's top level; a source the call computes names no architecture."""
    at_top = {
        id(decorator) for node in tree.body if isinstance(node, ast.ClassDef) for decorator in node.decorator_list
    }
    texts = {  # NAME = "text" at the top level: a source may name its architecture through such a constant
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and called_name(node.func) == "register_bridge"):
            continue
        for keyword in node.keywords:
            if keyword.arg == "source":
                name = architecture(keyword.value)
                yield texts.get(name, name), id(node) in at_top


def called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def architecture(source: ast.expr) -> str:
    """The class name a source names: `LlamaForCausalLM`, `transformers.LlamaForCausalLM` or "LlamaForCausalLM"."""
    if isinstance(source, ast.Constant) and isinstance(source.value, str):
        return source.value
    return called_name(source) or ast.dump(source)  # a computed source, matched by no architecture name
