"""`profiling.use_viztracer=true`: VizTracer beside nsys and the PyTorch profiler (docs/profiling.md)."""

import atexit
import functools
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, fields
from pathlib import Path
from types import FrameType
from typing import Any

import megatron.bridge.training.train as upstream_train
from megatron.bridge.training.config import ConfigContainer, ProfilingConfig
from viztracer import VizTracer

PATCHED = ("handle_profiling_step", "handle_profiling_stop")
# The profiler switches of a profiling config (Megatron Bridge's two and ours), with the names the log uses.
PROFILERS = {"use_nsys_profiler": "nsys", "use_pytorch_profiler": "pytorch", "use_viztracer": "viztracer"}
# How long a rank waits for its trace writer before it stops it: inside srun.sh's 30 s grace (docs/profiling.md).
WRITER_DEADLINE_S = 20.0
# Stopping a job signals every process of the rank: the trace writer must live through these.
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


@dataclass(kw_only=True)
class VizTracerProfilingConfig(ProfilingConfig):
    """Megatron Bridge's ProfilingConfig plus `use_viztracer`, a real field so OmegaConf accepts the override."""

    use_viztracer: bool = False

    def finalize(self) -> None:
        super().finalize()
        if self.use_viztracer and (self.use_nsys_profiler or self.use_pytorch_profiler):
            raise ValueError(
                "profiling.use_viztracer cannot run with profiling.use_nsys_profiler or profiling.use_pytorch_profiler:"
                " enable one profiler per run"
            )


def add_viztracer_field(cfg: ConfigContainer) -> None:
    """Give cfg.profiling the use_viztracer field, keeping every value the recipe set."""
    profiling = cfg.profiling if cfg.profiling is not None else ProfilingConfig()
    if not isinstance(profiling, VizTracerProfilingConfig):
        kept = {f.name: getattr(profiling, f.name) for f in fields(profiling) if f.init}
        cfg.profiling = VizTracerProfilingConfig(**kept)


def active_profilers(config: Any) -> list[str]:
    """The switches that are on, e.g. ['use_nsys_profiler'] (none for a missing config)."""
    return [flag for flag in PROFILERS if getattr(config, flag, False)]


def profiled(config: Any, rank: int) -> bool:
    """Whether this rank profiles at all (Megatron Bridge reads an empty profile_ranks as every rank)."""
    return bool(active_profilers(config)) and (not config.profile_ranks or rank in config.profile_ranks)


def say(rank: int, what: str) -> None:
    print(f"[profiling] rank {rank}: {what}", flush=True)


class WindowTracer:
    """One VizTracer over one profiling window of this process, written by a forked child (docs/profiling.md)."""

    def __init__(self) -> None:
        self.tracer: VizTracer | None = None
        self.writer: tuple[int, VizTracer] | None = None  # the forked writer's pid, and the stopped tracer it reads
        self.rank, self.used = 0, False

    def start(self, rank: int) -> None:
        run_id = os.environ.get("RUN_ID", f"pid{os.getpid()}")
        path = Path(os.environ.get("VIZTRACER_OUTPUT_DIR", Path("viztracer_output") / run_id), f"trace_rank{rank}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        # register_global=False, dump_raw=True: no reference kept at shutdown, the faster C writer (docs/profiling.md).
        self.tracer = VizTracer(
            output_file=str(path),
            log_torch=os.environ.get("VIZTRACER_LOG_TORCH", "0") == "1",
            register_global=False,
            verbose=0,
            dump_raw=True,
        )
        self.tracer.start()
        self.rank, self.used = rank, True
        # Only over the default action: a handler installed before stops training, and the window is written at exit.
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self.save_then_terminate)

    def stop(self) -> None:
        """End the window; a forked child writes the trace."""
        if self.tracer is not None:
            tracer, self.tracer = self.tracer, None
            tracer.stop()
            tracer.setpid()  # the trace names this rank's pid, not the writer's
            self.writer = fork_writer(tracer), tracer

    def reap(self, wait: bool) -> None:
        """Once the writer has exited: say how it ended, free the buffer; wait: kill it past WRITER_DEADLINE_S."""
        if self.writer is None:
            return
        pid, tracer = self.writer
        deadline = time.monotonic() + (WRITER_DEADLINE_S if wait else 0.0)
        while not (ended := os.waitpid(pid, os.WNOHANG))[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        code = os.waitstatus_to_exitcode(ended[1]) if ended[0] else None  # negative: the signal that ended it
        if code is None and not wait:
            return
        path = tracer.output_file
        if code is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            late = f"did not finish writing {path} within {WRITER_DEADLINE_S:g} s; stopped it,"
            say(self.rank, f"viztracer writer {late} the trace is missing or incomplete")
        elif code == 0:
            say(self.rank, f"viztracer trace written to {path}")
        else:
            say(self.rank, f"viztracer failed to write {path} (see its error above)")
        release(tracer)
        self.writer = None
        self.restore_sigterm()

    def flush(self) -> None:
        """Write a window that training left open (an exception, exit or signal inside it), and wait for the writer."""
        if self.tracer is not None:
            # Written in this process (no fork at shutdown), taken out first so that no second flush overwrites it.
            tracer, self.tracer = self.tracer, None
            tracer.stop()
            tracer.save()
            release(tracer)
            say(self.rank, f"viztracer trace written to {tracer.output_file}")
        self.reap(wait=True)
        self.restore_sigterm()

    def keep_sigterm(self) -> None:
        """Our handler again at each step while a trace is pending: native code may reset SIGTERM unseen by Python."""
        if signal.getsignal(signal.SIGTERM) == self.save_then_terminate:
            signal.signal(signal.SIGTERM, self.save_then_terminate)

    def restore_sigterm(self) -> None:
        """Once nothing is left to write, SIGTERM gets its default action back, unless someone replaced our handler."""
        ours = signal.getsignal(signal.SIGTERM) == self.save_then_terminate
        if ours and self.tracer is None and self.writer is None:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def save_then_terminate(self, signum: int, frame: FrameType | None) -> None:
        # The rank is going down: nothing may cut the write short, not a second stop signal nor DataLoader's SIGCHLD.
        for held in STOP_SIGNALS:
            signal.signal(held, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.flush()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def fork_writer(tracer: VizTracer) -> int:
    """The child that writes the stopped tracer's trace, then leaves without unwinding into training; its pid."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    pid = os.fork()
    if pid == 0:
        for held in STOP_SIGNALS:
            signal.signal(held, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        status = 1
        try:
            tracer.save()
            status = 0
        except BaseException:  # whatever it is, it must end here: printed, and the rank reports the failed write
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(status)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return pid


def release(tracer: VizTracer) -> None:
    # Free the trace buffer (and, with log_torch, the torch profiler) now rather than at interpreter shutdown.
    tracer.torch_profile = None
    tracer.clear()


WINDOW = WindowTracer()


def exit_traced_process(status: int) -> None:
    """Every atexit handler, then an exit without CPython's teardown (VizTracer 1.1.1's C tracer crashes there)."""
    if WINDOW.used:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def install() -> None:
    """Wrap Megatron Bridge's per-step profiling hooks to drive VizTracer and say where the window opens and closes."""
    step_hook, stop_hook = (getattr(upstream_train, name) for name in PATCHED)
    if getattr(step_hook, "__wrapped__", None) is not None:
        return

    def announce(config: Any, rank: int, event: str) -> None:
        say(rank, f"{'+'.join(PROFILERS[flag] for flag in active_profilers(config))} window {event}")

    @functools.wraps(step_hook)
    def handle_profiling_step(config: Any, iteration: int, rank: int, pytorch_prof: Any) -> Any:
        nvtx_context = step_hook(config, iteration, rank, pytorch_prof)
        WINDOW.reap(wait=False)
        WINDOW.keep_sigterm()
        if iteration == getattr(config, "profile_step_start", None) and profiled(config, rank):
            if getattr(config, "use_viztracer", False):
                WINDOW.start(rank)
            announce(config, rank, f"opens before step {iteration + 1}")
        return nvtx_context

    @functools.wraps(stop_hook)
    def handle_profiling_stop(
        config: Any, iteration: int, rank: int, pytorch_prof: Any, nsys_nvtx_context: Any = None
    ) -> None:
        stop_hook(config, iteration, rank, pytorch_prof, nsys_nvtx_context)
        if iteration == getattr(config, "profile_step_end", None) and profiled(config, rank):
            if getattr(config, "use_viztracer", False):
                WINDOW.stop()
            announce(config, rank, f"closes after step {iteration}")

    upstream_train.handle_profiling_step = handle_profiling_step
    upstream_train.handle_profiling_stop = handle_profiling_stop
    atexit.register(WINDOW.flush)
