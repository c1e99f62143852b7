"""A batch job runs without the nodes that failed its health check: `python3 exclude_nodes.py JOB_ID NODES` (or
exclude()) adds NODES to the job's ExcNodeList while the job is pending again after its requeue (SLURM changes
ExcNodeList of a pending job only), and says so on stderr. srun.sh starts it with SIGTERM ignored: the requeue's
SIGTERM reaches it meanwhile."""

from __future__ import annotations

import re
import subprocess
import sys


def excluded_nodes(job: str) -> str:
    """The job's ExcNodeList; empty for none."""
    out = subprocess.run(
        ["scontrol", "show", "job", "--oneliner", job], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    found = re.search(r" ExcNodeList=([^ ]*)", out)
    return "" if not found or found.group(1) == "(null)" else found.group(1)


def exclude(job: str, nodes: str) -> None:
    """Adds `nodes` (comma-separated) to the ExcNodeList of `job`."""
    excluded = ",".join(filter(None, [excluded_nodes(job), nodes]))
    update = subprocess.run(["scontrol", "update", f"JobId={job}", f"ExcNodeList={excluded}"], timeout=30, check=False)
    if update.returncode == 0:
        print(f"srun.sh: job {job} runs without {nodes} from now on (ExcNodeList={excluded})", file=sys.stderr)
    else:
        print(f"srun.sh: could not exclude {nodes} from job {job}: scontrol update refused it", file=sys.stderr)


if __name__ == "__main__":
    exclude(sys.argv[1], sys.argv[2])
