"""`mixed_precision=NAME`: one of Megatron Bridge's mixed-precision presets, resolved before anything starts.

Megatron Bridge looks a preset name up inside pretrain(), on every rank; resolved here into its MixedPrecisionConfig,
a misspelt name is refused first, --print-config shows what the preset sets, and `mixed_precision.FIELD=VALUE` changes
one of its fields (after the preset is chosen, whatever the order of the arguments).
"""

import difflib
from typing import Any

from hydra.core.override_parser.types import Override
from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.mixed_precision import (
    MIXED_PRECISION_RECIPES,
    MixedPrecisionConfig,
    get_mixed_precision_config,
)

from launcher.config.errors import UsageError

KEY = "mixed_precision"


def choose_preset(cfg: ConfigContainer, overrides: list[Override]) -> tuple[list[Override], dict[str, Any]]:
    """Apply a `mixed_precision=NAME` override and resolve the preset name the config holds.

    Returns the other overrides, and the chosen preset for the log (empty when the recipe's is kept).
    """
    choices = [o for o in overrides if is_preset_choice(o)]
    applied: dict[str, Any] = {}
    if choices:
        cfg.mixed_precision = applied[KEY] = choices[0].value()
    if isinstance(cfg.mixed_precision, str):
        cfg.mixed_precision = preset(cfg.mixed_precision)
    return [o for o in overrides if not is_preset_choice(o)], applied


def is_preset_choice(override: Override) -> bool:
    return override.key_or_group == KEY and not override.is_delete() and isinstance(override.value(), str)


def preset(name: str) -> MixedPrecisionConfig:
    try:
        return get_mixed_precision_config(name)
    except ValueError:
        names = sorted(n for n in MIXED_PRECISION_RECIPES if "-" not in n)  # each preset is also registered with '-'
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.8)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UsageError(f"unknown mixed_precision preset {name!r}: {hint}presets: {', '.join(names)}") from None
