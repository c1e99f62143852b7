"""What Megatron Bridge's console log says about a run, as the GPU suite reads it (the benchmarks read TensorBoard, and
find the iteration line with the same pattern, bench/launches.py's ITERATION).

Each logged iteration is one line: "[YYYY-MM-DD HH:MM:SS] iteration N/ M | ... elapsed time per iteration (ms): T |
... lm loss: L |". Peak memory is the line "[Rank 0] (after N iterations) memory (GB) | ... |
mem-max-allocated-gigabytes: G |", printed after the first logged iterations.
"""

import re
import statistics
from dataclasses import dataclass, field

from bench.launches import ITERATION

LM_LOSS = re.compile(r"lm loss: ([\d.E+-]+|nan|inf)", re.IGNORECASE)
MAX_ALLOCATED = re.compile(r"mem-max-allocated-gigabytes: ([\d.]+)")

# Steps left out of medians: the first builds kernels and caches, the second still settles.
WARMUP_STEPS = 2


@dataclass
class TrainingLog:
    step_ms: dict[int, float] = field(default_factory=dict)
    losses: dict[int, float] = field(default_factory=dict)
    peak_mem_gb: float | None = None


def steady_median(per_step: dict[int, float], skip: int) -> float | None:
    steady = [value for step, value in per_step.items() if step > skip]
    return statistics.median(steady) if steady else None


def parse(text: str) -> TrainingLog:
    log = TrainingLog()
    for line in text.splitlines():
        if iteration := ITERATION.search(line):
            step = int(iteration.group(1))
            log.step_ms[step] = float(iteration.group(2))
            if loss := LM_LOSS.search(line):
                log.losses[step] = float(loss.group(1))
        if memory := MAX_ALLOCATED.search(line):
            log.peak_mem_gb = max(log.peak_mem_gb or 0.0, float(memory.group(1)))
    return log
