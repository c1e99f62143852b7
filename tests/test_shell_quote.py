"""launcher/shell_quote.py against the real bash: q(value) is what `printf %q` prints for the value's bytes, in a
UTF-8 locale and in C, on text the code did not choose, and bash reads q's result back as those bytes."""

import contextlib
import locale
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.shell_quote import q, quoted

REPO = Path(__file__).resolve().parent.parent
LOCALES = ("C.UTF-8", "C")

# argv holds no NUL. A lone surrogate other than os.fsdecode's U+DC80..U+DCFF has no bytes, so no value holds one.
CHARACTERS = st.characters(exclude_categories=("Cs",), exclude_characters="\0")
# What the shell treats specially, what does not print, and bytes that are no UTF-8 alone but may be with their
# neighbours (os.fsdecode(b"\xc3") + os.fsdecode(b"\xa9") is é).
TRICKY = st.sampled_from(
    [*" \t\n\r\v\f\a\b\x1b\x01\x7f~#=:'\"\\$`!{}[]*?;&|<>(),^%@+-/.", "é", "€", "😀", "\u0085", "\u200b", "\u2028"]
    + [os.fsdecode(bytes([byte])) for byte in (0x80, 0xA9, 0xBF, 0xC3, 0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0xFF)]
)
VALUES = st.one_of(
    st.text(CHARACTERS, max_size=12),
    st.binary(max_size=12).map(lambda data: os.fsdecode(data.replace(b"\0", b""))),
    st.text(TRICKY, max_size=12),
)


def bash(script: str, *args: str, lc_all: str) -> list[str]:
    """What bash prints running SCRIPT with ARGS in locale LC_ALL, split at the NULs that end each value."""
    argv = [os.fsencode(word) for word in ("bash", "-c", script, "bash", *args)]
    run = subprocess.run(argv, env={**os.environ, "LC_ALL": lc_all}, capture_output=True, check=True)
    return [os.fsdecode(value) for value in run.stdout.split(b"\0")[:-1]]


def printf_q(values: list[str], lc_all: str) -> list[str]:
    return bash('printf "%q\\0" "$@"', *values, lc_all=lc_all)


@contextlib.contextmanager
def ctype_locale(name: str) -> Iterator[None]:
    """This process's LC_CTYPE set to NAME for the block, as if it had started in it."""
    before = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, name)
    try:
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, before)


@pytest.mark.parametrize("lc_all", LOCALES)
@settings(max_examples=300, deadline=None)
@given(values=st.lists(VALUES, min_size=1, max_size=8))
def test_q_is_what_printf_q_prints(lc_all: str, values: list[str]):
    with ctype_locale(lc_all):
        assert quoted(*values) == printf_q(values, lc_all)


@pytest.mark.parametrize("lc_all", LOCALES)
@settings(max_examples=300, deadline=None)
@given(values=st.lists(VALUES, min_size=1, max_size=8))
def test_bash_reads_q_back_as_the_values_bytes(lc_all: str, values: list[str]):
    with ctype_locale(lc_all):
        script = 'printf "%s\\0" ' + " ".join(quoted(*values))
    assert [os.fsencode(value) for value in bash(script, lc_all=lc_all)] == [os.fsencode(value) for value in values]


@pytest.mark.parametrize("lc_all", LOCALES)
def test_every_one_and_two_byte_value_is_quoted_as_printf_q_quotes_it(lc_all: str):
    """Every way a UTF-8 sequence can start, end early or go wrong within two bytes."""
    values = [os.fsdecode(bytes([first, second])) for first in range(1, 256) for second in range(1, 256)]
    with ctype_locale(lc_all):
        assert quoted(*values) == printf_q(values, lc_all)


def test_which_characters_print_is_the_c_librarys_answer():
    """Every character of the Basic and Supplementary Multilingual Planes, one value each: Python's Unicode data is
    newer than the C library's (U+11F00, KAWI SIGN CANDRABINDU, is Unicode 15), and bash asks the C library."""
    values = [chr(code) for code in range(1, 0x20000) if not 0xD800 <= code <= 0xDFFF]
    with ctype_locale("C.UTF-8"):
        ours = quoted(*values)
    theirs = [quoted_by_bash for start in range(0, len(values), 20000)
              for quoted_by_bash in printf_q(values[start : start + 20000], "C.UTF-8")]  # fmt: skip
    assert {value: mine for value, mine, real in zip(values, ours, theirs, strict=True) if mine != real} == {}


@pytest.mark.parametrize(
    ("value", "in_utf8", "in_c"),
    [
        ("", "''", "''"),
        ("#x", "\\#x", "\\#x"),
        ("x#", "x#", "x#"),
        ("PATH=~/bin:~/sbin:a~", "PATH=\\~/bin:\\~/sbin:a~", "PATH=\\~/bin:\\~/sbin:a~"),
        ("it's a $HOME, {x}", "it\\'s\\ a\\ \\$HOME\\,\\ \\{x\\}", "it\\'s\\ a\\ \\$HOME\\,\\ \\{x\\}"),
        ("a\tb\x1b[0m\x7f", "$'a\\tb\\E[0m\\177'", "$'a\\tb\\E[0m\\177'"),
        ("café", "café", "$'caf\\303\\251'"),
        ("caf" + os.fsdecode(b"\xe9"), "$'caf\\351'", "$'caf\\351'"),
        ("\u0085 is no space", "$'\\302\\205 is no space'", "$'\\302\\205 is no space'"),
    ],
)
def test_known_values_are_quoted_as_bash_52_quotes_them(value: str, in_utf8: str, in_c: str):
    with ctype_locale("C.UTF-8"):
        assert q(value) == in_utf8
    with ctype_locale("C"):
        assert q(value) == in_c


@pytest.mark.parametrize("lc_all", [*LOCALES, "POSIX"])
def test_q_follows_the_locale_python_started_in(lc_all: str):
    """The launcher's own start: Python sets LC_CTYPE from the environment (LC_ALL=C also turns on its UTF-8 mode)."""
    values = ["", "~x", "a b", "café", "\x01", os.fsdecode(b"\xc3\xa9\xc3"), "😀#"]
    program = "import sys; from launcher.shell_quote import quoted; print(*quoted(*sys.argv[1:]), sep='\\0')"
    env = {**os.environ, "LC_ALL": lc_all, "PYTHONPATH": str(REPO)}
    argv = [os.fsencode(word) for word in (sys.executable, "-c", program, *values)]
    run = subprocess.run(argv, env=env, capture_output=True, check=True)
    assert run.stdout.rstrip(b"\n").split(b"\0") == [os.fsencode(value) for value in printf_q(values, lc_all)]
