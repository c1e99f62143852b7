"""Launches that take turns on the same GPUs, so that a drifting machine drifts under all of them alike.

A plan is a list of blocks: the arms (launches) alive together, the first the reference, and how many rounds they run.
Every arm starts once, warms up, and is paused (SIGSTOP to its whole process tree: launcher, ranks, data loader
workers; it keeps its GPU memory but runs nothing). Round after round each arm in turn is resumed for 1 + settle +
turn_steps logged steps and paused again, the order rotating (A B, then B A). Between blocks the arms that leave are
stopped (SIGTERM: Megatron Bridge ends the step, flushes TensorBoard, exits) before those that join start. An arm
that fails is recorded, and its block goes on without it. The record holds when each turn began and ended by the
wall clock, which bench_turns.py matches with the wall times of the steps Megatron Bridge logged to TensorBoard.
"""

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench import launches

POLL_S = 0.02  # how long a pass waits for a line: the most an arm runs on after its stopping point was printed


@dataclass(frozen=True)
class Arm:
    name: str
    command: tuple[str, ...]
    env: dict[str, str]
    tokens_per_step: int
    gpus: int
    warmup_steps: int = 2
    noise_of: str | None = None  # the arm whose recipe this one repeats with another seed: the run-to-run noise
    note: str = ""
    recipe: str = ""  # what the command launches, for the checks and the report
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Block:
    arms: tuple[str, ...]  # the first is the reference of the others
    rounds: int


@dataclass
class Live:
    """An arm's launch in flight and what its console has said so far."""

    arm: Arm
    launch: launches.Launch
    last_step: int = 0
    steps_in_turn: int = 0
    paused: bool = False
    failure: str | None = None

    def take(self, line: str) -> bool:
        """Note what a console line says; True when it is a logged step."""
        if match := launches.ITERATION.search(line):
            self.last_step = int(match.group(1))
            self.steps_in_turn += 1
            return True
        return False

    def pause(self) -> None:
        self.launch.pause()
        self.paused = True

    def resume(self) -> None:
        self.launch.resume()
        self.paused = False

    @property
    def ended(self) -> bool:
        return self.launch.exited


@dataclass
class Turns:
    arms: dict[str, Arm]
    blocks: list[Block]
    turn_steps: int
    settle: int
    runs_dir: Path
    deadline: float  # time.monotonic() after which no block or round starts (math.inf: none)
    warmup_timeout_s: float = 600
    stall_s: float = 120  # an arm that logs no step for this long in its turn has failed
    on_progress: Callable[[dict], None] = lambda record: None
    live: dict[str, Live] = field(default_factory=dict)
    record: dict = field(default_factory=dict)

    def run(self) -> dict:
        self.record = {
            "settle": self.settle,
            "turn_steps": self.turn_steps,
            "arms": {name: arm_record(arm) for name, arm in self.arms.items()},
            "blocks": [{"index": i, "arms": list(b.arms), "rounds": b.rounds} for i, b in enumerate(self.blocks)],
            "turns": [],
        }
        try:
            for index, block in enumerate(self.blocks):
                if time.monotonic() >= self.deadline:
                    self.record["blocks"][index]["skipped"] = "no time left"
                    continue
                self.enter(block)
                self.play(index, block)
                self.on_progress(self.record)
        finally:
            for live in self.live.values():  # all at once: each takes a step and its exit
                live.launch.terminate()
            for name in list(self.live):
                self.retire(name)
        return self.record

    def enter(self, block: Block) -> None:
        """Stop the arms that are not in this block; start (or let go on) those that join it, up to their warm-up."""
        for name in [name for name in self.live if name not in block.arms]:
            self.retire(name)
        joining = [name for name in block.arms if name not in self.live or not self.warmed_up(self.live[name])]
        for name in joining:
            if name in self.live:
                self.live[name].resume()
            else:
                self.start(name)
        self.wait(lambda: all(self.warmed_up(self.live[n]) or self.live[n].ended for n in joining), joining)
        late = "by the plan's deadline" if time.monotonic() >= self.deadline else f"in {self.warmup_timeout_s:g} s"
        for name in [name for name in joining if not self.warmed_up(self.live[name])]:
            live = self.live[name]
            if live.ended:
                self.fail(name, f"ended after {live.last_step} of its {live.arm.warmup_steps} warm-up steps")
            else:
                self.fail(name, f"logged {live.last_step} of {live.arm.warmup_steps} warm-up steps {late}")

    def play(self, index: int, block: Block) -> None:
        for round_index in range(block.rounds):
            if time.monotonic() >= self.deadline:
                self.record["blocks"][index]["cut"] = f"after {round_index} rounds: no time left"
                return
            for name in block.arms:
                if name in self.live and self.live[name].ended:
                    self.fail(name, "ended between its turns")
            order = [name for name in rotated(block.arms, round_index) if self.usable(name)]
            if len(order) < min(2, len(block.arms)):
                self.record["blocks"][index]["cut"] = f"after {round_index} rounds: an arm failed"
                return
            for name in order:
                self.turn(index, round_index, name)

    def turn(self, block: int, round_index: int, name: str) -> None:
        live, wanted = self.live[name], 1 + self.settle + self.turn_steps
        live.steps_in_turn = 0
        began = time.time()
        live.resume()
        last_progress = time.monotonic()
        while live.steps_in_turn < wanted and not live.ended and time.monotonic() - last_progress < self.stall_s:
            if self.pump(active=live):
                last_progress = time.monotonic()
        live.pause()
        turn = {"block": block, "round": round_index, "arm": name, "began": began, "ended": time.time()}
        self.record["turns"].append(turn | {"last_step": live.last_step})
        if live.ended:
            self.fail(name, "ended during its turn")
        elif live.steps_in_turn < wanted:
            self.fail(name, f"logged no step for {self.stall_s:g} s in its turn")

    def wait(self, done: Callable[[], bool], warming: list[str]) -> None:
        """Until done() or the warm-up limit, and never past the plan's deadline: an arm that fails without exiting
        (a rank hung in its teardown) would otherwise hold the plan past its budget, and its report with it."""
        deadline = min(time.monotonic() + self.warmup_timeout_s, self.deadline)
        while not done() and time.monotonic() < deadline:
            self.pump(warming=warming)

    def pump(self, active: Live | None = None, warming: list[str] = ()) -> bool:
        """Take in every line that has arrived, waiting a little for the active arm's next; True when the active arm
        logged a step. Pause each arm that is warming up once it has warmed up."""
        stepped = False
        if active is not None:
            if line := active.launch.receive(POLL_S):
                stepped = active.take(line)
        else:
            time.sleep(POLL_S)
        for name, live in self.live.items():
            while (line := live.launch.receive(0)) is not None:
                stepped |= live.take(line) and live is active
            if live.paused or live.ended or live is active:
                continue
            if name in warming and self.warmed_up(live):
                live.pause()
        return stepped

    def warmed_up(self, live: Live) -> bool:
        return live.last_step >= live.arm.warmup_steps

    def usable(self, name: str) -> bool:
        live = self.live.get(name)
        return live is not None and not live.ended and live.failure is None

    def start(self, name: str) -> None:
        arm = self.arms[name]
        self.live[name] = Live(arm, launches.Launch(list(arm.command), self.runs_dir / name, arm.env))
        self.record["arms"][name]["started_at"] = time.time()

    def fail(self, name: str, why: str) -> None:
        live = self.live[name]
        if live.failure is None:
            live.failure = why
            tail = [text.rstrip() for _, text in live.launch.lines[-3:]]
            self.record["arms"][name]["failure"] = {"why": why, "last_lines": tail}

    def retire(self, name: str) -> None:
        """Stop the arm: resumed, then SIGTERM; Megatron Bridge ends its step and flushes TensorBoard."""
        live = self.live.pop(name)
        self.record["arms"][name]["stopped_at"] = time.time()
        live.launch.stop()
        deadline = time.monotonic() + 5
        while not live.launch.output_closed and time.monotonic() < deadline:
            live.launch.receive(deadline - time.monotonic())
        live.launch.close()
        self.record["arms"][name] |= {"retired": True, "returncode": live.launch.process.returncode}


def rotated(arms: tuple[str, ...], by: int) -> list[str]:
    """The turn order of a round: with two arms A B, then B A; with three A B C, B C A, C A B."""
    shift = by % len(arms)
    return [*arms[shift:], *arms[:shift]]


def arm_record(arm: Arm) -> dict:
    """What the record keeps of an arm; it runs in RUNS_DIR/<its name>."""
    return {key: value for key, value in dataclasses.asdict(arm).items() if key != "name"}
