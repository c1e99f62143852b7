"""The files of RUN_DIR that the launching host and the ranks share, by name (docs/launch.md). Standard library only."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import shutil
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

LAUNCH_PLAN = "launch-plan.json"  # the launch plan (launcher/host/plan.py), written once before the ranks start
LAUNCHER_LOG = "logs/launcher.log"  # what srun or torchrun said, the health check's and container removal's output
USAGE_ERROR = "logs/usage-error"  # the first rank's one-line error that every rank found
REQUEUES_LOG = "logs/requeues.log"  # a batch job's requeues, one line each
HANG = "hang"  # the hang watch's and the ranks' records (launcher/hang/); hang/stalled.txt: why it stopped them
HEALTH_JSON = "health.json"  # the health check's verdict
FAILED_NODES = "health/failed-nodes"  # the nodes it condemned
STOPPED = (130, 137, 143)  # a rank-R.status of SIGINT, SIGKILL, SIGTERM
UNLINKS_AT_ONCE = 32


@contextlib.contextmanager
def private_files() -> Iterator[None]:
    """Files and folders made meanwhile are their owner's only (umask 077), as every file of a run folder is."""
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def write_private(path: Path, text: str) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # a file a resumed run wrote before keeps its mode otherwise
    with open(descriptor, "w") as file:
        file.write(text)


def remove_all(paths: Iterable[Path]) -> None:
    """Unlinks, many at a time: each waits for the file system, and 4,096 ranks leave thousands of files a kind."""
    with ThreadPoolExecutor(UNLINKS_AT_ONCE) as unlinks:
        list(unlinks.map(lambda path: path.unlink(missing_ok=True), paths))


def remove_tree(path: str | Path) -> None:
    """PATH and all in it, files many at a time; what cannot be removed stays, as with rmtree(ignore_errors=True)."""
    files = [Path(folder, name) for folder, _, names in os.walk(path) for name in names]
    with contextlib.suppress(OSError):  # the others are removed all the same: every unlink was started
        remove_all(files)
    shutil.rmtree(path, ignore_errors=True)


def remove_rank_statuses(run_dir: str) -> None:
    """An earlier step's rank-R.status files: the failure report reads those of the step that just ended."""
    remove_all(Path(run_dir, "logs").glob("rank-*.status"))


@contextlib.contextmanager
def many_records() -> Iterator[None]:
    """Reading every rank's records without the cyclic garbage collector (docs/health.md)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_text(path: str | Path) -> str:
    """PATH's text; empty when it cannot be read."""
    try:
        with open(path, errors="surrogateescape") as file:
            return file.read()
    except OSError:
        return ""


@dataclasses.dataclass(order=True)
class RankEnd:
    """How a rank ended, from its rank-R.status; ranks that were stopped sort after one that failed."""

    stopped: bool
    when: float
    rank: str
    status: int
    host: str


def rank_ends(logs: Path) -> list[RankEnd]:
    """The ranks that ended with a non-zero status, the first first."""
    ends = []
    for path in logs.glob("rank-*.status"):
        words = path.read_text(errors="replace").split(maxsplit=2)
        if len(words) < 3 or not words[0].isdigit() or int(words[0]) == 0:
            continue
        status, rank = int(words[0]), path.name.removeprefix("rank-").removesuffix(".status")
        ends.append(RankEnd(status in STOPPED, float(words[1]), rank, status, words[2].strip()))
    return sorted(ends)
