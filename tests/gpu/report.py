"""Turn the GPU suite's records (JSON lines) into results JSON and a Markdown table.

python3 -m tests.gpu.report RECORDS.jsonl OUT_PREFIX     # writes OUT_PREFIX.json and OUT_PREFIX.md
"""

import json
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from bench import report

PACKAGES = ("torch", "megatron-core", "megatron-bridge", "transformer-engine", "viztracer")
COLUMNS = ("test", "outcome", "wall_s", "time_to_first_step_s", "median_step_ms", "peak_mem_gb")


def gpus() -> list[str]:
    query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
    return subprocess.run(query, capture_output=True, text=True, check=True).stdout.strip().splitlines()


def merge(records: list[dict]) -> list[dict]:
    """One row per test: its measurements and its pytest outcome."""
    rows: dict[str, dict] = {}
    for record in records:
        rows.setdefault(record["test"], {}).update(record)
    return list(rows.values())


def markdown(result: dict) -> str:
    lines = [
        f"# GPU suite, {result['date']}",
        "",
        f"Hardware: {'; '.join(result['gpus'])}. Python {result['python']}. "
        + ", ".join(f"{name} {version}" for name, version in result["versions"].items())
        + ".",
        "",
        *report.table(COLUMNS, ([row.get(column, "") for column in COLUMNS] for row in result["tests"])),
    ]
    lines += ["", "Other facts each test recorded:", ""]
    for row in result["tests"]:
        extra = {k: v for k, v in row.items() if k not in (*COLUMNS, "losses", "returncode")}
        if extra:
            lines.append(f"- `{row['test']}`: {json.dumps(extra, default=str)}")
    return "\n".join(lines) + "\n"


def main() -> None:
    records_path, prefix = Path(sys.argv[1]), Path(sys.argv[2])
    records = [json.loads(line) for line in records_path.read_text().splitlines() if line.strip()]
    result = {
        "date": report.timestamp(),
        "gpus": gpus(),
        "python": platform.python_version(),
        "versions": {name: metadata.version(name) for name in PACKAGES},
        "tests": merge(records),
    }
    report.write(prefix, result, markdown)


if __name__ == "__main__":
    main()
