"""The project stays small on purpose, as projects that keep a line limit in CI do: product code at most 7,000 lines,
bench/ at most 2,000, README.md at most 250, and no file of code above 450 lines outside tests/. Lines are counted as
`wc -l` counts them, in every .py and .sh file git tracks or would track (blank lines and comments included), so a
new capability makes room for itself."""

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PRODUCT = ("launcher", "recipes", "srun.sh", "entrypoint.py", "viztracer_plugin.py", "enroot.sh")
BUDGETS = {"product code": (PRODUCT, 7000), "bench/": (("bench",), 2000)}
README_LINES = 250
FILE_LINES = 450


def code_files(*places: str) -> list[Path]:
    """The .py and .sh files under PLACES that git tracks, or would (untracked, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *places],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    return [REPO / name for name in listed if name.endswith((".py", ".sh")) and (REPO / name).is_file()]


def lines(path: Path) -> int:
    return path.read_bytes().count(b"\n")


def test_lines_are_counted_as_wc_counts_them():
    files = code_files(*PRODUCT)
    assert files
    out = subprocess.run(["wc", "-l", *map(str, files)], capture_output=True, text=True, check=True).stdout
    assert int(out.splitlines()[-1].split()[0]) == sum(map(lines, files))


@pytest.mark.parametrize("what", BUDGETS)
def test_code_stays_within_its_line_budget(what: str):
    places, budget = BUDGETS[what]
    counted = sum(map(lines, code_files(*places)))
    assert counted <= budget, f"{what} is {counted} lines, over its budget of {budget}: make room before adding"


def test_readme_stays_within_its_line_budget():
    assert lines(REPO / "README.md") <= README_LINES


def test_no_file_of_code_outside_tests_is_above_its_line_limit():
    big = {str(path.relative_to(REPO)): lines(path) for path in code_files(".") if lines(path) > FILE_LINES}
    assert not {name: count for name, count in big.items() if not name.startswith("tests/")}
