"""A batch job runs without the nodes that failed its health check: added to its ExcNodeList (docs/health.md)."""

from __future__ import annotations

import re
import subprocess
import sys


def exclude(job: str, nodes: str) -> None:
    """Adds `nodes` (comma-separated) to the ExcNodeList of `job`, and says so on stderr."""
    show = ["scontrol", "show", "job", "--oneliner", job]
    shown = subprocess.run(show, capture_output=True, text=True, timeout=30, check=False).stdout
    found = re.search(r" ExcNodeList=([^ ]*)", shown)
    before = "" if not found or found.group(1) == "(null)" else found.group(1)
    excluded = ",".join(filter(None, [before, nodes]))
    update = subprocess.run(["scontrol", "update", f"JobId={job}", f"ExcNodeList={excluded}"], timeout=30, check=False)
    if update.returncode == 0:
        print(f"srun.sh: job {job} runs without {nodes} from now on (ExcNodeList={excluded})", file=sys.stderr)
    else:
        print(f"srun.sh: could not exclude {nodes} from job {job}: scontrol update refused it", file=sys.stderr)
