"""Asking the ranks for the hang report (SIGUSR2; dumps.py answers) and reading their records into one Rank each."""

import contextlib
import dataclasses
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from launcher.hang.progress import read_json
from launcher.run_files import remove_all

ANSWER_WAIT_S = 10.0  # the most a report waits for the ranks' answers
STACKS_GRACE_S = 3.0  # how long a rank whose stacks came may still take to dump its flight recorder
FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
THREAD = re.compile(r"^(?:Current thread|Thread) 0x(?P<ident>[0-9a-f]+) \(most recent call first\):$")
# /proc/PID/stat's state letters (proc(5)), as the report says them for a rank that did not answer.
PROCESS_STATES = {"R": "running", "S": "sleeping", "D": "in uninterruptible sleep", "T": "stopped"}
PROCESS_STATES |= {"t": "stopped by a tracer", "Z": "exited, not reaped", "X": "dead", "I": "idle"}


@dataclasses.dataclass
class Rank:
    rank: int
    host: str
    registered: dict | None = None  # rank-R.json: pid, start time, main thread
    answer: dict | None = None  # answer-rank-R.json: distributed, backend, last step
    frames: list[str] = dataclasses.field(default_factory=list)  # the main thread's, most recent first
    dump: dict | None = None  # the flight recorder record, or its summary (launcher/hang/collectives.py)
    ended: str | None = None  # how it ended, if it had (its status record)

    def where(self) -> str:
        pid = f" (pid {self.registered['pid']})" if self.registered else ""
        return f"rank {self.rank} on {self.host}{pid}"

    def last_step(self) -> str:
        step = (self.answer or {}).get("last_step")
        return "" if step is None else f", last step {step}"

    def silent(self) -> bool:
        """Registered, still running as far as the records say, and neither its stacks nor its answer came."""
        return self.registered is not None and not self.ended and not self.answer and not self.frames


def thread_stacks(text: str) -> dict[int, list[str]]:
    """faulthandler's dump -> {thread ident: ["func (file:line)", ...]}, most recent call first."""
    stacks: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if header := THREAD.match(line):
            current = stacks.setdefault(int(header.group("ident"), 16), [])
            current.clear()  # a later dump of the same thread replaces an earlier one
        elif (frame := FRAME.match(line)) and current is not None:
            current.append(f"{frame.group('func')} ({frame.group('file')}:{frame.group('line')})")
    return stacks


def main_thread_frames(text: str, ident: int | None) -> list[str]:
    stacks = thread_stacks(text)
    return stacks[ident] if ident in stacks else next(iter(stacks.values()), [])


def short(frame: str) -> str:
    """'func (/long/path/to/file.py:12)' -> 'func (file.py:12)'."""
    match = re.fullmatch(r"(.*) \((.*):(\d+)\)", frame)
    return f"{match.group(1)} ({Path(match.group(2)).name}:{match.group(3)})" if match else frame


def position(frames: list[str]) -> str:
    """Where a rank's main thread is, in a few words: 'all_reduce (distributed_c10d.py:2870) from step (x.py:9)'."""
    if not frames:
        return "no stacks"
    own = next((frame for frame in frames if "/torch/" not in frame and "threading.py" not in frame), None)
    return short(frames[0]) if own is None or own == frames[0] else f"{short(frames[0])} from {short(own)}"


def process_stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (proc(5)): [0] the state letter, [19] the start time."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_start_time(pid: int) -> str:
    """With the pid, it names one process for good (pids are reused): each rank registers it (dumps.py)."""
    return process_stat(pid)[19]


def live_state(record: dict) -> str | None:
    """The state letter of a registered rank's process while its pid is still that process (pids are reused)."""
    try:
        fields = process_stat(record["pid"])
    except OSError:
        return None
    return fields[0] if fields[19] == record.get("start_time") else None


def process_state(record: dict) -> str:
    """What /proc says of a registered rank's process on this host."""
    state = live_state(record)
    if state is None:
        return "its process is gone"
    return f"{PROCESS_STATES[state]} ({state})" if state in PROCESS_STATES else f"in state {state}"


def registered_ranks(hang: Path) -> dict[int, dict]:
    records = (read_json(path) for path in hang.glob("rank-*.json"))
    return {int(record["rank"]): record for record in records if record is not None}


def stacks_size(hang: Path, rank: int) -> int:
    try:
        return (hang / f"stacks-rank-{rank}.txt").stat().st_size
    except OSError:
        return 0


def forget_earlier_answers(hang: Path) -> None:
    remove_all([*hang.glob("answer-rank-*.json"), *(hang / "fr").glob("rank-*")])


def signal_step(step: str) -> str | None:
    result = subprocess.run(["scancel", "--signal=USR2", step], capture_output=True, text=True, check=False)
    return None if result.returncode == 0 else (result.stderr.strip() or f"scancel exited {result.returncode}")


def signal_local(registered: dict[int, dict]) -> str | None:
    """SIGUSR2 to each registered rank that is still the process it registered (pids are reused)."""
    for record in registered.values():
        if live_state(record) is not None:
            with contextlib.suppress(ProcessLookupError):  # it ended in between
                os.kill(int(record["pid"]), signal.SIGUSR2)
    return None


def ask(hang: Path, step: str | None, ended: set[int], before: dict[int, int]) -> float:
    """SIGUSR2 to job step `step` (None: each registered rank), then the wait for ranks not ended; the time asked."""
    registered = registered_ranks(hang)
    forget_earlier_answers(hang)
    asked = time.time()
    failed = signal_step(step) if step else signal_local(registered)
    if failed:
        print(f"srun.sh: hang report: could not signal the ranks: {failed}", file=sys.stderr)
    wait_for_answers(hang, set(registered) - ended, before)
    return asked


def wait_for_answers(hang: Path, pending: set[int], before: dict[int, int]) -> None:
    """Until every pending rank answered, or its stacks came STACKS_GRACE_S ago, or ANSWER_WAIT_S passed."""
    started = time.monotonic()
    stacks_at: dict[int, float] = {}
    while pending and time.monotonic() - started < ANSWER_WAIT_S:
        now = time.monotonic()
        for rank in sorted(pending):
            if (hang / f"answer-rank-{rank}.json").exists():
                pending.discard(rank)
                continue
            if stacks_size(hang, rank) > before.get(rank, 0):
                stacks_at.setdefault(rank, now)
            if now - stacks_at.get(rank, now) > STACKS_GRACE_S:
                pending.discard(rank)
        if pending:
            time.sleep(0.5)


def read_dump(hang: Path, answer: dict | None) -> dict | None:
    """The summary of its flight recorder that a rank answered with, else the record itself (fr/rank-R)."""
    answer = answer or {}
    if answer.get("flight_recorder_summary"):
        return answer["flight_recorder_summary"]
    if not answer.get("flight_recorder"):
        return None
    try:
        with (hang / "fr" / answer["flight_recorder"]).open("rb") as record:
            return pickle.load(record)
    except (OSError, pickle.UnpicklingError, EOFError):
        return None


def gather(run_dir: Path, world: int, host_of: list[str], before: dict[int, int], ended: dict[int, str]) -> dict:
    """Every rank's records; `before`: its stacks file's size before the request, `ended`: how ended ranks did."""
    hang = run_dir / "hang"
    registered = registered_ranks(hang)
    ranks = {}
    for number in range(world):
        record = registered.get(number)
        host = record["host"] if record else host_of[number] if number < len(host_of) else "?"
        answer = read_json(hang / f"answer-rank-{number}.json")
        try:
            with (hang / f"stacks-rank-{number}.txt").open("rb") as stacks:
                stacks.seek(before.get(number, 0))
                text = stacks.read().decode(errors="replace")
        except OSError:
            text = ""
        frames = main_thread_frames(text, record["main_thread"] if record else None)
        ranks[number] = Rank(number, host, record, answer, frames, read_dump(hang, answer), ended.get(number))
    return ranks
