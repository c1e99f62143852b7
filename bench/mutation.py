"""Mutation score of the code that judges a run: mutmut (pinned in versions.txt, [test]) over one module at a time,
against that module's own fast tests, and a table per module: mutants killed, survived, timed out, not covered.

    python3 bench/mutation.py                                   # the five modules, one after the other
    python3 bench/mutation.py --module launcher/config/checks.py    # one module
    python3 bench/mutation.py --module launcher/config/data.py --only 'launcher.config.data.x_check*'   # some mutants
    python3 bench/mutation.py --module launcher/config/checks.py --show-survivors   # and each survivor's diff

mutmut 3 writes its mutated tree (mutants/) next to pyproject.toml and runs pytest there, forked once per mutant;
this script gives each module a copy of the checkout in WORK_DIR/<module>/, so the checkout itself never changes and
a module's results stay there for `mutmut show NAME` / `mutmut results` (run in that copy). The settings every module
shares are in pyproject.toml's [tool.mutmut]; the script adds the module and its tests to the copy's.

mutmut brings requirements of its own (libcst, coverage, setproctitle, textual): install it with them,
`pip install mutmut==3.8.1`, into the test environment.
"""

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Each module and the tests that target it (tests/test_entrypoint.py's checks go through entrypoint.resolve()).
TESTS = {
    "launcher/hang/answers.py": ["tests/test_hang_report.py"],
    "launcher/hang/collectives.py": ["tests/test_hang_report.py"],
    "launcher/hang/judge.py": ["tests/test_hang_report.py"],
    "launcher/hang/report.py": ["tests/test_hang_report.py"],
    "launcher/health/records.py": ["tests/test_health_report.py"],
    "launcher/health/judge.py": ["tests/test_health_report.py"],
    "launcher/health/table.py": ["tests/test_health_report.py"],
    "launcher/health/report.py": ["tests/test_health_report.py"],
    "launcher/config/data.py": ["tests/test_data_check.py"],
    "launcher/config/splits.py": ["tests/test_splits.py"],
    "launcher/config/checks.py": ["tests/test_checks.py"],
    "launcher/config/validation.py": [
        "tests/test_checks.py",
        "tests/test_entrypoint.py::test_cuda_graphs_without_the_te_rng_tracker_are_refused_before_any_rank_builds_a_model",
        "tests/test_entrypoint.py::test_bad_override_is_refused_with_the_fix",
        "tests/test_entrypoint.py::test_rank_arithmetic_is_checked_before_launch",
        "tests/test_entrypoint.py::test_moe_expert_parallel_must_divide_the_ranks",
        "tests/test_entrypoint.py::test_megatron_fsdp_job_is_checked_with_the_connections_its_ranks_get",
    ],
    "launcher/config/overrides.py": ["tests/test_overrides.py"],
}
# Not copied: the environment, build and run outputs, earlier mutants.
SKIP = shutil.ignore_patterns(
    ".git", ".venv", "mutants", "outputs", "__pycache__", ".devkit", ".deepep", ".whl", ".cudnn"
)
OUTCOMES = ("killed", "survived", "timeout", "no tests")
HEADER = "| module | mutants | killed | survived | timed out | no tests | other | score: (killed + timed out) / all |"


def module_copy(work_dir: Path, module: str, tests: list[str]) -> Path:
    """A fresh copy of the checkout whose [tool.mutmut] mutates `module` and runs `tests`."""
    copy = work_dir / Path(module).stem
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(REPO, copy, ignore=SKIP, symlinks=True)
    pyproject = copy / "pyproject.toml"
    header = "[tool.mutmut]\n"
    text = pyproject.read_text()
    assert header in text, "pyproject.toml has no [tool.mutmut]"
    added = f"only_mutate = {json.dumps([module])}\npytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
    pyproject.write_text(text.replace(header, header + added, 1))
    return copy


def mutmut(copy: Path, *args: str, log: Path | None = None) -> str:
    command = [sys.executable, "-m", "mutmut", *args]
    if log is None:
        return subprocess.run(command, cwd=copy, capture_output=True, text=True, check=True).stdout
    with log.open("w") as out:
        subprocess.run(command, cwd=copy, stdout=out, stderr=subprocess.STDOUT, check=False)
    return ""


def outcomes(copy: Path) -> dict[str, str]:
    """Each mutant's outcome, from `mutmut results --all true` ("    NAME: OUTCOME" lines)."""
    parts = (line.strip().rpartition(": ") for line in mutmut(copy, "results", "--all", "true").splitlines())
    return {name: outcome for name, _, outcome in parts if name}


def run_module(work_dir: Path, module: str, args: argparse.Namespace) -> dict[str, str]:
    copy = module_copy(work_dir, module, args.tests or TESTS[module])
    children = [f"--max-children={args.max_children}"] if args.max_children else []
    mutmut(copy, "run", *children, *args.only, log=copy / "mutmut-run.log")
    found = outcomes(copy)
    if all(outcome == "not checked" for outcome in found.values()):  # e.g. the tests fail on the unmutated code
        sys.exit(f"mutation.py: mutmut tested no mutant of {module}: see {copy / 'mutmut-run.log'}")
    return found


def table_row(module: str, found: dict[str, str]) -> str:
    counts = collections.Counter(found.values())
    other = sum(n for outcome, n in counts.items() if outcome not in OUTCOMES)
    # A mutant no test runs ("no tests") is one the tests miss: it counts against the score.
    score = f"{100 * (counts['killed'] + counts['timeout']) / len(found):.1f}%"
    cells = [module, str(len(found)), *(str(counts[outcome]) for outcome in OUTCOMES), str(other), score]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--module", action="append", choices=sorted(TESTS), help="default: all five")
    parser.add_argument(
        "--only", action="append", default=[], help="mutant names (globs), e.g. 'launcher.config.checks.x_check*'"
    )
    parser.add_argument("--tests", action="append", help="pytest paths to run instead of the module's own tests")
    parser.add_argument("--max-children", type=int, help="mutants tested side by side (mutmut's default: the CPUs)")
    parser.add_argument("--work-dir", type=Path, help="where the copies go (default: a new temporary folder)")
    parser.add_argument("--show-survivors", action="store_true", help="print each surviving mutant's diff")
    args = parser.parse_args()
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="mutation-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    print(f"mutation.py: copies and mutmut logs in {work_dir}", flush=True)
    rows = []
    for module in args.module or list(TESTS):
        found = run_module(work_dir, module, args)
        rows.append(table_row(module, found))
        print(rows[-1], flush=True)
        for name in sorted(name for name, outcome in found.items() if outcome == "survived"):
            print(mutmut(work_dir / Path(module).stem, "show", name) if args.show_survivors else f"  survived: {name}")
    print("", HEADER, "|---|" + "---|" * 7, *rows, sep="\n")


if __name__ == "__main__":
    main()
