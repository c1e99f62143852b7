"""bench/report.py: every bench script's PREFIX.json and PREFIX.md."""

import json
from pathlib import Path

from bench import report


def test_writes_the_numbers_and_the_table_beside_each_other_and_returns_the_table(tmp_path: Path):
    prefix = tmp_path / "2026-11-30-launch-bench"
    result = {"date": report.timestamp(), "cases": {"a": {"median_step_ms": 4352.8}}}
    table = report.write(prefix, result, lambda r: f"# {r['date']}\n")
    assert json.loads(report.json_path(prefix).read_text()) == result
    assert (tmp_path / "2026-11-30-launch-bench.md").read_text() == table == f"# {result['date']}\n"
    assert report.json_path(prefix) == tmp_path / "2026-11-30-launch-bench.json"
