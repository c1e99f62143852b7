"""Training progress: rank 0's RUN_DIR/hang/progress.json and timeline.log (docs/health.md). Standard library only."""

import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

PROGRESS_FILE = "progress.json"
TIMELINE_FILE = "timeline.log"


@dataclasses.dataclass
class Last:
    """This rank's last record, and the longest time between two records that followed a training step."""

    step: int | None = None
    time: float | None = None  # time.time() of the record
    longest_step_s: float | None = None
    phase: str | None = None
    monotonic: float | None = None


LAST = Last()


class Registry(Protocol):
    """What Megatron Bridge's CallbackManager offers: register(event, fn)."""

    def register(self, event_name: str, fn: Any) -> None: ...


def replace_file(path: Path, data: bytes) -> None:
    """Write, then rename: a reader on any host sees the old file or the new one, never a part."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def write_json(path: Path, data: dict[str, Any]) -> None:
    replace_file(path, json.dumps(data).encode())


def read_json(path: Path) -> dict | None:
    """A record the ranks or the watch write (write, then rename), or None: not written yet, or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class Recorder:
    def __init__(self, run_dir: Path, rank: int) -> None:
        self.path = run_dir / "hang" / PROGRESS_FILE if rank == 0 else None

    def record(self, step: int, phase: str = "training", timeline: str = "") -> None:  # TIMELINE: the timeline's phase
        now = time.monotonic()
        if LAST.phase == "training" and phase != "restarting" and LAST.monotonic is not None:
            LAST.longest_step_s = max(LAST.longest_step_s or 0.0, now - LAST.monotonic)
        LAST.step, LAST.time, LAST.phase, LAST.monotonic = step, time.time(), phase, now
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            record = {"step": step, "phase": phase, "time": LAST.time, "longest_step_s": LAST.longest_step_s}
            write_json(self.path, record)
            with self.path.with_name(TIMELINE_FILE).open("a") as line:  # one short write: a line whole, or none
                line.write(f"{LAST.time:.3f} {step} {timeline or phase}\n")


def saving_after(checkpoint: Any, step: int) -> str | None:
    """The save Megatron Bridge makes after completed step `step`, if any: a persistent one before a local one."""
    for kind in ("save_interval", "non_persistent_save_interval"):
        interval = getattr(checkpoint, kind, None)
        if checkpoint.save and interval and step % interval == 0:
            return kind
    return None


def register(callbacks: Registry, run_dir: Path, rank: int) -> None:
    """Record progress from Megatron Bridge's training callbacks (the completed step: train_state.step + 1)."""
    recorder = Recorder(run_dir, rank)

    def step_end(context: Any) -> None:
        step = context.state.train_state.step + 1
        recorder.record(step, "saving" if saving_after(context.state.cfg.checkpoint, step) else "training")

    def record_step(phase: str, timeline: str = "") -> Callable[[Any], None]:
        return lambda context: recorder.record(context.state.train_state.step, phase, timeline)

    callbacks.register("on_train_step_end", step_end)
    callbacks.register("on_eval_step_end", record_step("training"))
    callbacks.register("on_checkpoint_save", record_step("training", "saved"))
    callbacks.register("on_train_end", record_step("ended"))
