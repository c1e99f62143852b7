"""The simulated job of bench/bench_scale.py: N ranks, 8 a node on nodes node0001, node0002, ..., where its faults are
(see bench/scale_tree.py), and where its records lie."""

from __future__ import annotations

import dataclasses
import functools
import random
import time
from pathlib import Path

PER_NODE = 8


@dataclasses.dataclass(frozen=True)
class Job:
    """Its size, where its faults are, and when the ranks were asked (time.time(), every rank's clock)."""

    ranks: int
    missing: int
    silent: int
    slow_node: int
    slow_gpu: int
    asked: float

    @property
    def nodes(self) -> int:
        return self.ranks // PER_NODE

    @functools.cached_property
    def hosts(self) -> list[str]:
        return [f"node{index + 1:04d}" for index in range(self.nodes)]

    @property
    def node_list(self) -> str:
        """SLURM_JOB_NODELIST."""
        return "node0001" if self.nodes == 1 else f"node[0001-{self.nodes:04d}]"

    @property
    def link_fault(self) -> bool:
        """A capped link needs retests, which need 3 nodes; fewer get a slow GPU."""
        return self.nodes >= 3

    def host(self, rank: int) -> str:
        return f"node{rank // PER_NODE + 1:04d}"

    @property
    def slow_host(self) -> str:
        return self.host(self.slow_node * PER_NODE) if self.link_fault else self.host(self.slow_gpu)


@dataclasses.dataclass(frozen=True)
class Tree:
    """Where a job's records lie: the run folder, and beside it what the ranks write only when asked."""

    root: Path
    run_dir = property(lambda self: self.root / "run")
    staged_answers = property(lambda self: self.root / "staged-answers")
    staged_health = property(lambda self: self.root / "staged-health")


def faults(ranks: int, seed: int) -> Job:
    """The job of `ranks` ranks with its faults where `seed` puts them; the missing and the silent rank on different
    nodes where there are two."""
    rng = random.Random(seed)
    missing = rng.randrange(ranks)
    others = [rank for rank in range(ranks) if rank // PER_NODE != missing // PER_NODE]
    silent = rng.choice(others or [rank for rank in range(ranks) if rank != missing])
    rng.randrange(ranks)  # once the first failed rank: drawn still, so that a seed places the others as it did
    slow_node, slow_gpu = rng.randrange(ranks // PER_NODE), rng.randrange(ranks)
    return Job(ranks, missing, silent, slow_node, slow_gpu, asked=time.time())
