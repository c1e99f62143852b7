"""How every benchmark records what it measured: DIR/NAME.json with the numbers, DIR/NAME.md with the table."""

import argparse
import json
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path


def parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's command line: python3 -m bench.MODULE --out DIR ..."""
    made = argparse.ArgumentParser(
        prog=f"python3 -m bench.{module}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    made.add_argument("--out", type=Path, required=True, metavar="DIR", help="where the tables and the runs go")
    return made


def positive(text: str) -> int:
    """argparse type: a whole number of 1 or more."""
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return number


def timestamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def json_path(prefix: Path) -> Path:
    return prefix.with_suffix(".json")


def row(cells: Iterable[object]) -> str:
    """One Markdown table row; None shows as "-"."""
    return "| " + " | ".join("-" if cell is None else str(cell) for cell in cells) + " |"


def table(header: Iterable[str], rows: Iterable[Iterable[object]] = ()) -> list[str]:
    header = list(header)
    return [row(header), "|" + "---|" * len(header), *(row(cells) for cells in rows)]


def write(prefix: Path, result: dict, markdown: Callable[[dict], str]) -> str:
    """Write PREFIX.json and PREFIX.md; returns the Markdown, for the script to print."""
    text = markdown(result)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    json_path(prefix).write_text(json.dumps(result, indent=2, default=str) + "\n")
    prefix.with_suffix(".md").write_text(text)
    return text
