"""bench/report.py: every bench script's PREFIX.json and PREFIX.md."""

import argparse
import inspect
import json
from pathlib import Path

import pytest

from bench import bench_startup, report


def test_writes_the_numbers_and_the_table_beside_each_other_and_returns_the_table(tmp_path: Path):
    prefix = tmp_path / "2026-11-30-launch-bench"
    result = {"date": report.timestamp(), "cases": {"a": {"median_step_ms": 4352.8}}}
    table = report.write(prefix, result, lambda r: f"# {r['date']}\n")
    assert json.loads(report.json_path(prefix).read_text()) == result
    assert (tmp_path / "2026-11-30-launch-bench.md").read_text() == table == f"# {result['date']}\n"
    assert report.json_path(prefix) == tmp_path / "2026-11-30-launch-bench.json"


def test_a_table_has_its_header_its_rule_and_a_dash_for_a_missing_value():
    assert report.table(("arm", "ms"), [["ours", 12.5], ["seed", None]]) == [
        "| arm | ms |",
        "|---|---|",
        "| ours | 12.5 |",
        "| seed | - |",
    ]


@pytest.mark.parametrize("module", [bench_startup])
@pytest.mark.parametrize("bad", [["--rounds", "0"], ["--rounds", "two"], []])
def test_a_benchmark_refuses_bad_options_before_it_starts_anything(module, bad: list[str], tmp_path: Path, capsys):
    """--rounds 0 used to run no launch and then fail on the table it never made; without --out there is nowhere to
    write. Both are refused in one line with status 2, and nothing is written."""
    out = ["--out", str(tmp_path / "out")] if bad else []
    with pytest.raises(SystemExit) as refused:
        module.main([*out, *bad])
    assert refused.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith(f"python3 -m bench.{module.__name__.split('.')[-1]}: error: ")
    assert not (tmp_path / "out").exists()


# Text from outside the project: every word of the standard library's argparse source, and digits of other scripts.
OUTSIDE_WORDS = sorted(set(inspect.getsource(argparse).split()) | {"\u00b2", "\u0663", " 7 ", "-1", "0", "08", ""})


def test_a_count_option_takes_what_int_takes_from_one_up_and_refuses_all_else_with_argparses_error():
    taken = 0
    for text in OUTSIDE_WORDS:
        try:
            expected = int(text)
        except ValueError:
            expected = 0
        if expected >= 1:
            assert report.positive(text) == expected, text
            taken += 1
        else:
            with pytest.raises(argparse.ArgumentTypeError, match="is not a whole number of 1 or more"):
                report.positive(text)
    assert taken >= 3  # " 7 ", "08", "\u0663" and argparse's own numbers
