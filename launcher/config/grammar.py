"""The launch's NAME=VALUE arguments in Hydra's override grammar, each also an assignment (docs/launch.md)."""

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, Override
from hydra.errors import HydraException

from launcher.assignments import NotAssignmentError, assignment
from launcher.config.overrides import edits_keys, sweep_refusal, typed_value
from launcher.errors import UsageError, first_line

# What a sweep typed for a string may not hold (quotes, escapes, brackets): text typed and string meant could differ.
NOT_TEXT = set("'\"\\()[]{}$")


def parse(arguments: list[str]) -> list[Override]:
    parser = OverridesParser.create()
    parsed: list[Override] = []
    for argument in arguments:
        try:
            (override,) = parser.parse_overrides([argument])
            assignment(argument)  # refuses `~` and `=VALUE`, whose empty NAME Hydra takes
        except (HydraException, NotAssignmentError) as error:
            reason = first_line(error) if isinstance(error, HydraException) else "NAME is empty"
            raise UsageError(
                f"malformed argument {argument!r}: expected NAME=VALUE in Hydra syntax, e.g. train.train_iters=1000"
                f" ({reason})"
            ) from None
        if override.is_sweep_override() and not may_be_text(override):
            raise UsageError(sweep_refusal(override, None))
        if override.key_or_group in {earlier.key_or_group for earlier in parsed}:
            raise UsageError(f"{override.key_or_group!r} is given twice: keep one NAME=VALUE per key")
        parsed.append(override)
    return parsed


def may_be_text(override: Override) -> bool:
    """A plain sweep of choices, a,b,c, that a field taking a string can take as the text typed."""
    sweep = override.value()
    return (
        isinstance(sweep, ChoiceSweep)
        and sweep.simple_form
        and not edits_keys(override)
        and not NOT_TEXT & set(typed_value(override))
    )
