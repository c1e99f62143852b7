"""srun.sh --nsys: a rank that profiling.profile_ranks names runs itself again under nsys (docs/profiling.md)."""

import os
import socket
import sys
from pathlib import Path

from megatron.bridge.training.config import ConfigContainer

from launcher.config.checks import profiled_ranks
from launcher.errors import UsageError, from_srun_sh

PROFILE_ARGS = (
    "profile -t cuda,nvtx -s none --cpuctxsw=none --capture-range=cudaProfilerApi --capture-range-end=stop"
    " --enable efa_metrics --force-overwrite=true"
).split()
# Set in the process nsys starts, so it does not start nsys again.
UNDER_NSYS = "SRUNSH_UNDER_NSYS"
HOST = socket.gethostname().split(".")[0]


def profile_command(cfg: ConfigContainer, argv: list[str]) -> list[str] | None:
    """The command that runs this rank (`python argv`) under nsys, or None when this rank is not profiled."""
    nsys = from_srun_sh("SRUNSH_NSYS")  # set under srun.sh --nsys only
    if not nsys or os.environ.get(UNDER_NSYS):
        return None
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if rank not in profiled_ranks(cfg, world_size):
        return None
    report = Path(os.environ.get("RUN_DIR", ".")) / "nsys" / f"profile-{HOST}-rank{rank}"
    return [nsys, *PROFILE_ARGS, "-o", str(report), sys.executable, *argv]


def exec_under_nsys(command: list[str]) -> None:
    """Replace this process by `command`; nsys then starts the rank again as its child."""
    Path(command[command.index("-o") + 1]).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.environ[UNDER_NSYS] = "1"
    try:
        os.execvp(command[0], command)
    except FileNotFoundError:
        raise UsageError(
            f"--nsys needs nsys, but SRUNSH_NSYS={command[0]!r} is not found on {HOST}:"
            " install it in the image or set SRUNSH_NSYS"
        ) from None
