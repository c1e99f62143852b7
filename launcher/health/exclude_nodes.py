"""A batch job runs without the nodes that failed its health check: the supervisor adds them to the job's ExcNodeList
while the job is pending again after its requeue (SLURM changes ExcNodeList of a pending job only)."""

from __future__ import annotations

import re
import subprocess
import sys


def excluded_nodes(job: str) -> str:
    out = subprocess.run(
        ["scontrol", "show", "job", "--oneliner", job], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    found = re.search(r" ExcNodeList=([^ ]*)", out)
    return "" if not found or found.group(1) == "(null)" else found.group(1)


def exclude(job: str, nodes: str) -> None:
    """Adds `nodes` (comma-separated) to the ExcNodeList of `job`, and says so on stderr."""
    excluded = ",".join(filter(None, [excluded_nodes(job), nodes]))
    update = subprocess.run(["scontrol", "update", f"JobId={job}", f"ExcNodeList={excluded}"], timeout=30, check=False)
    if update.returncode == 0:
        print(f"srun.sh: job {job} runs without {nodes} from now on (ExcNodeList={excluded})", file=sys.stderr)
    else:
        print(f"srun.sh: could not exclude {nodes} from job {job}: scontrol update refused it", file=sys.stderr)
