"""launcher/assignments.py, the one reading of a launch's NAME=VALUE / ~NAME arguments, on text the code did not choose:
split() accepts exactly what srun.sh's check on the launching host accepted (its two regexes, written here as the
reference), with that check's message; section() reads inprocess_restart.* as the in-process restart plan read it by
hand; and a rank (launcher/config/overrides.py) takes as an assignment exactly what split() takes."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.assignments import Assignment, NotAssignmentError, assignment, section, split
from launcher.config import grammar
from launcher.errors import UsageError, first_line
from launcher.host import preflight
from launcher.host.plan import LaunchPlan

REPO = Path(__file__).resolve().parent.parent
# Any text: unicode, newlines, NUL (which argv cannot carry, but the shape does not depend on it)...
ANY_TEXT = st.text(max_size=20)
# ...and text made of what matters to the shape and to Hydra, in odd places.
ODD_TEXT = st.text(st.sampled_from("=~+ \n\t\r.,[]'\"$a1é😀\u2028\x85"), max_size=8)
ARGUMENT = st.one_of(ANY_TEXT, ODD_TEXT)
# What bash's printf %q, and so srun.sh's messages, can be given: no NUL, no lone surrogate.
ARGV_TEXT = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=20),
    ODD_TEXT,
)
SECTION = "inprocess_restart"
# Arguments about the section: its two resets and near misses of them, its fields' assignments and deletes.
RESET = st.sampled_from([f"~{SECTION}", f"{SECTION}=null"])
NEAR_RESET = st.sampled_from([f"{SECTION}= null", f"~{SECTION}=null", f"~{SECTION} ", SECTION, f"{SECTION}="])
FIELD = st.builds(
    str.__add__,
    st.sampled_from([f"{SECTION}.", f"+{SECTION}.", f"~{SECTION}.", f" {SECTION}.", SECTION]),
    st.one_of(st.sampled_from(["enabled=true", "enabled= on ", "granularity=rank\n", "a.b=1", "x"]), ODD_TEXT),
)


def host_accepts(argument: str) -> bool:
    """srun.sh's check of an argument's shape before split() (check_arguments in launcher/host/preflight.py)."""
    return bool(re.fullmatch(r"~.+", argument, re.S) or re.fullmatch(r"[^=].*=.*", argument, re.S))


def settings_before(assignments: list[str]) -> dict[str, str]:
    """The in-process restart plan's own reading of inprocess_restart.* before it read section() (its settings()), as
    the reference: each NAME=VALUE split at its first `=` by hand."""
    found: dict[str, str] = {}
    for argument in assignments:
        if argument in (f"~{SECTION}", f"{SECTION}=null"):
            found.clear()
        name, _, value = argument.partition("=")
        if name.startswith(f"{SECTION}."):
            found[name.removeprefix(f"{SECTION}.")] = value.strip()
    return found


def preflight_refusal(argument: str) -> str | None:
    """What srun.sh's check on the launching host says of ./srun.sh recipe.py ARGUMENT; None where it takes it."""
    try:
        preflight.check_arguments(LaunchPlan(), ["recipe.py", argument])
    except UsageError as refused:
        return str(refused)
    return None


# ---- split ---------------------------------------------------------------------------------------------------------


def test_an_assignment_is_split_at_its_first_equals_and_a_delete_has_no_value():
    assert split(["a.b=1", "c=x=y", "~d", "~e=2", "+f.g=", "h= spaced "]) == [
        Assignment("a.b", "1", "a.b=1"),
        Assignment("c", "x=y", "c=x=y"),
        Assignment("d", None, "~d"),
        Assignment("e", None, "~e=2"),
        Assignment("+f.g", "", "+f.g="),
        Assignment("h", " spaced ", "h= spaced "),
    ]
    assert split([]) == []


@pytest.mark.parametrize("argument", ["", "~", "=5", "=", "train.train_iters", "a\nb"])
def test_an_argument_of_neither_shape_is_refused_with_srun_shs_line(argument: str):
    with pytest.raises(NotAssignmentError) as refused:
        split(["a=1", argument, "also bad"])
    assert refused.value.text == argument
    assert isinstance(refused.value, ValueError)
    assert str(refused.value) == (
        f"argument {preflight.q(argument)} is not NAME=VALUE: write it as NAME=VALUE, e.g. train.train_iters=1000"
    )


@settings(max_examples=400, deadline=None)
@given(argument=ARGUMENT)
def test_split_accepts_exactly_what_the_launching_hosts_regexes_accept(argument: str):
    if not host_accepts(argument):
        with pytest.raises(NotAssignmentError):
            assignment(argument)
        return
    (given,) = split([argument])
    assert given.text == argument
    if argument.startswith("~"):
        assert (given.value, given.name) == (None, argument[1:].partition("=")[0])
    else:
        assert f"{given.name}={given.value}" == argument
        assert given.name and "=" not in given.name


@settings(max_examples=150, deadline=None)
@given(argument=ARGV_TEXT)
def test_split_refuses_what_srun_sh_refuses_in_its_words(argument: str):
    if argument in preflight.OPTIONS:  # an option after the recipe has a message of its own
        return
    expected = preflight_refusal(argument)
    try:
        split([argument])
    except NotAssignmentError as refused:
        assert str(refused) == expected
    else:
        assert expected is None


def test_the_launching_host_can_split_without_the_training_stack():
    """python -S: no site-packages, only the standard library and this checkout."""
    subprocess.run([sys.executable, "-S", "-c", "import launcher.assignments"], cwd=REPO, check=True)


# ---- section -------------------------------------------------------------------------------------------------------


def test_a_section_is_its_fields_last_value_wins_and_a_reset_drops_what_came_before():
    fields = ["inprocess_restart.enabled=true", "x.enabled=false", "inprocess_restart.granularity= rank "]
    later = ["inprocess_restart.active_world_size=8", "inprocess_restart.active_world_size=16", "~inprocess_restart.x"]
    given = split([*fields, "~inprocess_restart", *later])
    assert section(given, SECTION) == {"active_world_size": "16"}
    assert section(given[:3], SECTION) == {"enabled": "true", "granularity": "rank"}
    assert section([*given, *split(["inprocess_restart=null"])], SECTION) == {}
    assert section(given, "x") == {"enabled": "false"}


@settings(max_examples=600, deadline=None)
@given(arguments=st.lists(st.one_of(RESET, NEAR_RESET, FIELD, FIELD, ARGUMENT), max_size=8))
def test_section_reads_inprocess_restart_as_the_restart_plan_does(arguments: list[str]):
    """On the arguments srun.sh lets through, that is: it refuses any other before the plan reads them."""
    accepted = [argument for argument in arguments if host_accepts(argument)]
    assert section(split(accepted), SECTION) == settings_before(accepted)


# ---- the rank ------------------------------------------------------------------------------------------------------


def hydra_refusal(argument: str) -> HydraException | None:
    try:
        OverridesParser.create().parse_overrides([argument])
    except HydraException as refused:
        return refused
    return None


@settings(max_examples=300, deadline=None)
@given(argument=ARGUMENT)
def test_a_rank_takes_as_an_assignment_exactly_what_split_takes(argument: str):
    """A rank refuses what split() refuses, before Hydra's reading of the value matters; what split() takes, the rank
    refuses only for Hydra's grammar (in Hydra's words) or as a sweep, never for its shape."""
    try:
        grammar.parse([argument])
        refusal = None
    except UsageError as refused:
        refusal = str(refused)
    malformed = f"malformed argument {argument!r}: expected NAME=VALUE in Hydra syntax, e.g. train.train_iters=1000"
    hydra = hydra_refusal(argument)
    if not host_accepts(argument):
        assert refusal == f"{malformed} ({first_line(hydra) if hydra else 'NAME is empty'})"
    elif hydra is not None:
        assert refusal == f"{malformed} ({first_line(hydra)})"
    else:
        assert refusal is None or "is a Hydra sweep, which a launch cannot run" in refusal


@pytest.mark.parametrize("argument", ["~", "=5", "=", "= a"])
def test_a_rank_refuses_the_empty_name_that_hydra_would_take(argument: str):
    with pytest.raises(UsageError) as refused:
        grammar.parse([argument])
    assert str(refused.value) == (
        f"malformed argument {argument!r}: expected NAME=VALUE in Hydra syntax, e.g. train.train_iters=1000"
        " (NAME is empty)"
    )
