"""The checkpoint intervals left open, chosen while training by Young/Daly's optimum (docs/failures.md)."""

import math
import os
import statistics
import time
from collections import deque
from typing import Any

from launcher.checkpoints.plan import ONE_NODE_MTBF_S
from launcher.errors import from_srun_sh
from launcher.hang import progress

PROBE_STEP = 3  # the first steps compile and warm up: the first local save, measured, follows this one
STEPS_KEPT = 32  # the median step is over the last this many steps that followed no save
PERSISTENT_OVER_LOCAL = 10  # the persistent save covers what local ones cannot (a lost node): the rarer one
LOCAL, PERSISTENT = "non_persistent_save_interval", "save_interval"


def optimum_s(save_s: float, mtbf_s: float) -> float:
    """Daly's optimum interval in seconds for a save of SAVE_S and a fault every MTBF_S; never below the save."""
    return max(math.sqrt(2 * save_s * mtbf_s) - save_s, save_s)


class Intervals:
    """Chooses the intervals in TO_CHOOSE from each save's measured cost; it outlives in-process restarts."""

    def __init__(self, to_choose: set[str], mtbf_s: float) -> None:
        self.to_choose, self.mtbf_s = to_choose, mtbf_s
        self.steps: deque[float] = deque(maxlen=STEPS_KEPT)
        self.chosen: dict[str, int] = {}
        self.step_end: float | None = None  # time.monotonic() of the last step's end
        self.saving: str | None = None  # the kind of save that follows the last step

    def on_step_end(self, context: Any) -> None:
        """A step that follows a save is timed as the save's cost: what it held training, whether the save wrote
        synchronously or handed its write on (Megatron Bridge's on_checkpoint_save comes only once that is done)."""
        step, now = context.state.train_state.step + 1, time.monotonic()
        if self.step_end is not None and self.saving is None:
            self.steps.append(now - self.step_end)
        elif self.step_end is not None and self.saving in self.to_choose and self.steps:
            self.choose(self.saving, max(now - self.step_end - statistics.median(self.steps), 0.0))
        self.step_end, ckpt = now, context.state.cfg.checkpoint
        for kind in self.to_choose:
            setattr(ckpt, kind, self.chosen.get(kind) or self.probe(kind, step))
        self.saving = progress.saving_after(ckpt, step)

    def probe(self, kind: str, step: int) -> int | None:
        """An interval that saves after this step, the first at PROBE_STEP (the persistent one a step later)."""
        first = PROBE_STEP + (kind == PERSISTENT and LOCAL in self.to_choose)
        return step if step == first else None

    def choose(self, kind: str, save_s: float) -> None:
        steps = self.steps_for(optimum_s(save_s, self.mtbf_s), kind)
        if steps != self.chosen.get(kind) and os.environ.get("RANK", "0") == "0":
            what = "local" if kind == LOCAL else "persistent"
            print(
                f"entrypoint.py: a {what} checkpoint held training {save_s:.2f} s: one every {steps} step(s)"
                f" ({statistics.median(self.steps):.2f} s a step, a fault expected every {self.mtbf_s:.0f} s)",
                flush=True,
            )
        self.chosen[kind] = steps

    def on_train_start(self, _context: Any) -> None:
        """Training starts, or starts again after an in-process restart: its first step is not timed."""
        self.step_end, self.saving = None, None

    def steps_for(self, seconds: float, kind: str) -> int:
        steps = max(1, round(seconds / statistics.median(self.steps)))
        if kind == PERSISTENT and self.chosen.get(LOCAL):
            steps = max(steps, PERSISTENT_OVER_LOCAL * self.chosen[LOCAL])
        return steps


def register(callbacks: progress.Registry, to_choose: set[str]) -> None:
    if not to_choose:
        return
    intervals = Intervals(to_choose, float(from_srun_sh("SRUNSH_MTBF_S") or ONE_NODE_MTBF_S))
    callbacks.register("on_train_step_end", intervals.on_step_end)
    callbacks.register("on_train_start", intervals.on_train_start)
