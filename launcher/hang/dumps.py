"""What a rank writes into RUN_DIR/hang/ when srun.sh asks for a hang report (docs/health.md, "In the code")."""

import contextlib
import faulthandler
import os
import pickle
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from launcher.hang import collectives, progress
from launcher.hang.answers import process_start_time

SIGNAL = signal.SIGUSR2

# torch's flight recorder switches, under their current and older names (docs/health.md, "In the code").
TORCH_ENVIRONMENT = {
    ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"): "2000",
    ("TORCH_NCCL_ENABLE_TIMING",): "1",
    ("TORCH_NCCL_DUMP_ON_TIMEOUT",): "1",
}
# With in-process restart, no dump of NCCL's own: it would outlast NVRx's hard timeout (docs/health.md).
RESTART_ENVIRONMENT = {**TORCH_ENVIRONMENT, ("TORCH_NCCL_DUMP_ON_TIMEOUT",): "0"}

_installed: dict[str, Any] = {}  # the open stacks file and the wake-up socket live as long as the process


def install(run_dir: Path, rank: int, in_process_restart: bool = False) -> None:
    """Answer srun.sh's SIGUSR2 from now on. Call it from the main thread, before torch.distributed starts."""
    directory = run_dir / "hang"
    for subdirectory in ("fr", "nccl-timeout"):
        (directory / subdirectory).mkdir(parents=True, exist_ok=True)
    timeout_dumps = {("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"): f"{directory}/nccl-timeout/rank-"}
    torch_environment = RESTART_ENVIRONMENT if in_process_restart else TORCH_ENVIRONMENT
    for names, value in {**torch_environment, **timeout_dumps}.items():
        if not any(name in os.environ for name in names):
            os.environ[names[0]] = value
    stacks = open(directory / f"stacks-rank-{rank}.txt", "a")  # faulthandler writes to it until exit
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    signal.signal(SIGNAL, lambda _signum, _frame: None)  # Python's handler writes the signal to the wake-up socket
    faulthandler.register(SIGNAL, file=stacks, all_threads=True, chain=True)  # stacks first, then Python's handler
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    _installed.update(stacks=stacks, reader=reader, writer=writer)
    thread = threading.Thread(target=answer_requests, args=(reader, directory, rank, stacks), daemon=True)
    thread.name = "srun.sh hang report"
    thread.start()
    signal.pthread_sigmask(signal.SIG_BLOCK, {SIGNAL})
    pid = os.getpid()
    record = {"rank": rank, "host": socket.gethostname(), "pid": pid, "start_time": process_start_time(pid)}
    progress.write_json(directory / f"rank-{rank}.json", record | {"main_thread": threading.main_thread().ident})


def answer_requests(reader: socket.socket, directory: Path, rank: int, stacks: IO[str]) -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {SIGNAL})  # this thread, and only this one, takes the signal
    while True:
        received = reader.recv(64)
        asked = time.time()
        if SIGNAL not in received:
            continue  # another signal with a Python handler (SIGINT, SIGTERM): not a request
        try:
            answer(directory, rank, stacks, asked)
        except OSError as error:  # a full or vanished run directory: the stacks are written all the same
            print(f"srun.sh hang report: rank {rank} could not answer: {error}", file=sys.stderr, flush=True)


def answer(directory: Path, rank: int, stacks: IO[str], asked: float) -> None:
    """Called once faulthandler has written the stacks: make them durable, dump the flight recorder, say so."""
    with contextlib.suppress(OSError):  # unsynced, the stacks stay in the page cache: the launching host may see them
        os.fsync(stacks.fileno())  # a network file system shows another host only what reached the server
    distributed = sys.modules.get("torch.distributed")
    initialized = bool(distributed and distributed.is_available() and distributed.is_initialized())
    backend = str(distributed.get_backend()) if initialized else None
    result = {"rank": rank, "time": asked, "distributed": initialized, "backend": backend}
    last = progress.LAST
    result.update(last_step=last.step, last_step_time=last.time, longest_step_s=last.longest_step_s)
    if initialized:
        result.update(dump_flight_recorder(directory / "fr" / f"rank-{rank}", backend or ""))
    progress.write_json(directory / f"answer-rank-{rank}.json", result)


def dump_flight_recorder(path: Path, backend: str) -> dict[str, str]:
    """torch's flight recorder of the default group's backend, without call sites (symbolizing them takes seconds)."""
    from torch._C import _distributed_c10d as c10d

    dump = c10d._dump_nccl_trace if "nccl" in backend else c10d._dump_fr_trace
    try:
        data = dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    except RuntimeError as error:
        return {"flight_recorder_error": f"{type(error).__name__}: {error}"}
    return record_flight_recorder(path, data)


def record_flight_recorder(path: Path, data: bytes) -> dict[str, Any]:
    """DATA into PATH as torch pickled it; the answer's fields: its name, and its summary where this code reads it."""
    progress.replace_file(path, data)
    fields: dict[str, Any] = {"flight_recorder": path.name}
    with contextlib.suppress(pickle.UnpicklingError, EOFError, AttributeError, KeyError, TypeError, ValueError):
        fields["flight_recorder_summary"] = collectives.summary(pickle.loads(data))
    return fields
