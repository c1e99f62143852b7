"""The recipe's config as the command line sets it, and what is refused (docs/launch.md, "In the code")."""

import dataclasses
import difflib
import inspect
import types
import typing
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from megatron.bridge.training.config import ConfigContainer, InProcessRestartConfig, NVRxStragglerDetectionConfig
from megatron.bridge.training.mixed_precision import MIXED_PRECISION_RECIPES, get_mixed_precision_config
from megatron.bridge.training.utils import omegaconf_utils
from megatron.bridge.utils.activation_map import DTYPE_MAP
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

import viztracer_plugin
from launcher import trackers
from launcher.config import outputs
from launcher.errors import UsageError, first_line

# What a recipe's configure() may raise for bad input; anything else is a bug and keeps its traceback.
RECIPE_ERRORS = (ValueError, TypeError, KeyError, OSError, AssertionError, AttributeError, ImportError)
SECTIONS = {"inprocess_restart": InProcessRestartConfig, "nvrx_straggler": NVRxStragglerDetectionConfig}
PRESET = "mixed_precision"


def configured(recipe: ModuleType, overrides: list[Override], run_dir: Path) -> tuple[ConfigContainer, dict[str, Any]]:
    """The recipe's config with every override applied, and what each override set (by key, for the log)."""
    kwargs, config_overrides = split_for_configure(recipe.configure, overrides)
    cfg = build_config(recipe, kwargs)
    for override in config_overrides:  # a SECTIONS field set where the recipe left its section None: the defaults
        name, dot, _ = override.key_or_group.partition(".")
        if name in SECTIONS and dot and getattr(cfg, name) is None:
            setattr(cfg, name, SECTIONS[name]())
    outputs.place_outputs(cfg, run_dir)
    config_overrides, preset = choose_preset(cfg, config_overrides)
    applied = {**kwargs, **preset, **apply(cfg, config_overrides)}
    trackers.place(cfg, run_dir, set(applied))
    # A run resumes from its own checkpoints; some upstream recipes save without loading (docs/launch.md).
    if cfg.checkpoint.load is None:
        cfg.checkpoint.load = cfg.checkpoint.save
    return cfg, applied


def adds(override: Override) -> bool:
    return override.is_add() or override.is_force_add()


def edits_keys(override: Override) -> bool:
    """`+NAME=`, `++NAME=` or `~NAME`: an edit of the config's keys rather than of a value."""
    return adds(override) or override.is_delete()


def typed_value(override: Override) -> str:
    return override.input_line.split("=", 1)[1].strip()


def as_text(override: Override, annotation: Any) -> Override:
    """A sweep for a field that takes only a string, as the string typed; any other sweep is refused."""
    if not override.is_sweep_override():
        return override
    if annotation not in (str, str | None):  # typing's Optional[str] is equal to str | None
        raise UsageError(sweep_refusal(override, annotation))
    (text,) = OverridesParser.create().parse_overrides([f"{override.key_or_group}='{typed_value(override)}'"])
    return text


def sweep_refusal(override: Override, annotation: Any) -> str:
    if annotation is None:  # the field is not known yet, or is no dataclass field
        advice = "give one value, or write a list as NAME=[a,b]"
    else:
        advice = "write a list as NAME=[a,b]" if matches_type([], annotation) else "give one value"
    return f"{override.input_line!r} is a Hydra sweep, which a launch cannot run: {advice}"


def split_for_configure(
    configure: Callable[..., ConfigContainer], overrides: list[Override]
) -> tuple[dict[str, Any], list[Override]]:
    parameters = inspect.signature(configure).parameters
    kwargs: dict[str, Any] = {}
    config_overrides: list[Override] = []
    for given in overrides:
        name = given.key_or_group
        if name not in parameters or edits_keys(given):
            config_overrides.append(given)
            continue
        annotation = parameters[name].annotation
        known = annotation is not inspect.Parameter.empty
        override = as_text(given, annotation if known else None)
        if known and not matches_type(override.value(), annotation):
            typed = f"{name}={override.get_value_string()}"
            raise UsageError(f"{typed} has the wrong type: configure() takes {type_name(annotation)}")
        kwargs[name] = override.value()
    return kwargs, config_overrides


def build_config(recipe: ModuleType, kwargs: dict[str, Any]) -> ConfigContainer:
    name = Path(recipe.__file__).name
    try:
        cfg = recipe.configure(**kwargs)
    except RECIPE_ERRORS as error:
        raise UsageError(f"recipe {name}: configure() failed: {type(error).__name__}: {first_line(error)}") from None
    if not isinstance(cfg, ConfigContainer):
        raise UsageError(f"recipe {name}: configure() returned {type(cfg).__name__}, not a ConfigContainer")
    viztracer_plugin.add_viztracer_field(cfg)
    return cfg


def choose_preset(cfg: ConfigContainer, overrides: list[Override]) -> tuple[list[Override], dict[str, Any]]:
    """Resolve the preset, `mixed_precision=NAME` applied (misspelt: refused); the other overrides, the one chosen."""
    applied: dict[str, Any] = {}
    for choice in filter(is_preset_choice, overrides):  # one at most: grammar.parse refuses a key given twice
        cfg.mixed_precision = applied[PRESET] = choice.value()
    if isinstance(cfg.mixed_precision, str):
        try:
            cfg.mixed_precision = get_mixed_precision_config(cfg.mixed_precision)
        except ValueError:
            # Each preset is also registered with '-' in its name.
            names = sorted(n for n in MIXED_PRECISION_RECIPES if "-" not in n)
            close = difflib.get_close_matches(cfg.mixed_precision, names, n=1, cutoff=0.8)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UsageError(
                f"unknown mixed_precision preset {cfg.mixed_precision!r}: {hint}presets: {', '.join(names)}"
            ) from None
    return [o for o in overrides if not is_preset_choice(o)], applied


def is_preset_choice(override: Override) -> bool:
    return override.key_or_group == PRESET and not override.is_delete() and isinstance(override.value(), str)


def apply(cfg: ConfigContainer, overrides: list[Override]) -> dict[str, Any]:
    """Apply overrides to cfg in place, each key and value checked against the dataclasses; each key's new value."""
    if not overrides:
        return {}
    tree, excluded = omegaconf_utils.create_omegaconf_dict_config(cfg)
    for override in overrides:
        check_key(cfg, tree, override)
    overrides = [as_text(override, field_annotation(cfg, override.key_or_group)) for override in overrides]
    try:
        tree = omegaconf_utils.parse_hydra_overrides(tree, [o.input_line for o in overrides])
    except omegaconf_utils.OverridesError as error:
        raise UsageError(first_line(error.__cause__ or error)) from None
    kept = [override for override in overrides if not override.is_delete()]
    for override in kept:
        check_value(cfg, tree, override)
    omegaconf_utils.apply_overrides(cfg, OmegaConf.to_container(tree, resolve=True), excluded)
    return {o.key_or_group: selected(tree, o.key_or_group) for o in kept}


def selected(tree: DictConfig, key: str) -> Any:
    value = OmegaConf.select(tree, key)
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def check_key(cfg: ConfigContainer, tree: DictConfig, override: Override) -> None:
    key = override.key_or_group
    parts = key.split(".")
    node: Any = tree
    for depth, part in enumerate(parts):
        parent = ".".join(parts[:depth])
        if node is None:
            raise UsageError(f"cannot set {key!r}: {parent!r} is null in this recipe; set it in the recipe first")
        if not isinstance(node, DictConfig):
            raise UsageError(f"cannot set {key!r}: {parent!r} is a value, not a section")
        if part not in node:
            if depth == len(parts) - 1 and adds(override) and not is_dataclass_at(cfg, parts[:-1]):
                return
            raise UsageError(unknown_key_message(key, parent, part, list(node.keys()), override))
        node = node[part]
    if override.is_delete() and is_dataclass_at(cfg, parts[:-1]):
        raise UsageError(f"'~{key}' would delete a config field, which Megatron Bridge ignores: set {key}=null instead")


def unknown_key_message(key: str, prefix: str, part: str, siblings: list[str], override: Override) -> str:
    if adds(override):
        return (
            f"'+{key}' adds a key the config does not have, and Megatron Bridge would drop it silently: "
            "use an existing key, without '+'"
        )
    close = difflib.get_close_matches(part, [str(s) for s in siblings], n=1, cutoff=0.6)
    hint = f"; did you mean '{prefix + '.' if prefix else ''}{close[0]}'?" if close else ""
    where = f"{prefix!r} has no key {part!r}" if prefix else f"the config has no section {part!r}"
    return f"unknown config key {key!r} ({where}){hint}"


def object_at(cfg: ConfigContainer, parts: list[str]) -> Any:
    node: Any = cfg
    for part in parts:
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


def is_dataclass_at(cfg: ConfigContainer, parts: list[str]) -> bool:
    return dataclasses.is_dataclass(object_at(cfg, parts))


def field_annotation(cfg: ConfigContainer, key: str) -> Any:
    """The annotation of the dataclass field a key names; None where it names no field of a dataclass."""
    parts = key.split(".")
    parent = object_at(cfg, parts[:-1])
    return field_types(type(parent)).get(parts[-1]) if dataclasses.is_dataclass(parent) else None


def check_value(cfg: ConfigContainer, tree: DictConfig, override: Override) -> None:
    key = override.key_or_group
    annotation = field_annotation(cfg, key)
    try:
        value = selected(tree, key)
    except InterpolationResolutionError as error:
        raise UsageError(
            f"{override.input_line!r} cannot be resolved ({first_line(error)}): give a value, or ${{KEY}} of a key"
            " the config has"
        ) from None
    if annotation is not None and not matches_type(value, annotation):
        *parents, name = key.split(".")
        raise UsageError(
            f"{key}={override.get_value_string()} has the wrong type: "
            f"{type(object_at(cfg, parents)).__name__}.{name} takes {type_name(annotation)}"
        )


def field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of a dataclass; a field whose annotation cannot be resolved is left unchecked."""
    try:
        return typing.get_type_hints(cls)
    except (NameError, TypeError):
        return {}


# What a parsed override value must be to fit a field of each scalar type.
SCALARS: dict[Any, Callable[[Any], bool]] = {
    bool: lambda value: isinstance(value, bool),
    int: lambda value: isinstance(value, int) and not isinstance(value, bool),
    float: lambda value: isinstance(value, (int, float)) and not isinstance(value, bool),
    str: lambda value: isinstance(value, str),
    Path: lambda value: isinstance(value, str),
    # The names Megatron Bridge's omegaconf_utils makes dtypes of (a list or a dict would not hash).
    torch.dtype: lambda value: isinstance(value, str) and value in DTYPE_MAP,
}


def matches_type(value: Any, annotation: Any) -> bool:
    """Whether a parsed override value can be stored in a field annotated so (lenient where unsure)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any or isinstance(annotation, typing.TypeVar):
        return True
    if origin in (typing.Union, types.UnionType):
        return any(matches_type(value, arg) for arg in args)
    if annotation is type(None) or annotation is None:
        return value is None
    if origin is typing.Literal:
        return value in args
    if origin in (list, tuple, set, frozenset) or annotation in (list, tuple):
        return isinstance(value, (list, tuple)) and (
            not args or args[-1] is Ellipsis or all(matches_type(v, args[0]) for v in value)
        )
    if origin is dict or annotation is dict:
        return isinstance(value, dict)
    if annotation in SCALARS:
        return SCALARS[annotation](value)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        # A list or a dict is never a member, and testing it against the members would hash it.
        return isinstance(value, (str, int)) and (
            value in annotation.__members__ or value in {m.value for m in annotation}
        )
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return isinstance(value, dict) or value is None
    return True


def type_name(annotation: Any) -> str:
    if annotation is torch.dtype or torch.dtype in typing.get_args(annotation):
        return "a dtype: " + ", ".join(sorted(name for name in DTYPE_MAP if not name.startswith("torch.")))
    # A class by its name; anything else as written (Optional[int], list[str], Literal['a', 'b']).
    return annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")
