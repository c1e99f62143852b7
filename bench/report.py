"""How every bench script records what it measured: PREFIX.json with the numbers, PREFIX.md with the table."""

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path


def timestamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def json_path(prefix: Path) -> Path:
    return prefix.with_suffix(".json")


def write(prefix: Path, result: dict, markdown: Callable[[dict], str]) -> str:
    """Write PREFIX.json and PREFIX.md; returns the Markdown, for the script to print."""
    table = markdown(result)
    json_path(prefix).write_text(json.dumps(result, indent=2, default=str) + "\n")
    prefix.with_suffix(".md").write_text(table)
    return table
