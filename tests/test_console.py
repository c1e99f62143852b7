"""launcher/host/console.py on what ranks really print: the stderr of a real torch process (a UserWarning of torch's,
c10's error and warning lines with a C++ exception's frames, and an uncaught exception through the excepthook that
torch.distributed installs, "[rank0]: Traceback ..."), as every rank of a job would print it, the ranks' lines
interleaved as hypothesis draws them."""

import io
import random
import re
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.errors import UsageError
from launcher.host import console
from launcher.host.console import Console, same_text, shown_ranks

# A rank as the start-up of a job sees one: a warning of torch's own, c10's lines as a store that cannot be reached
# makes them, and a fault that every rank raises.
RANK = """\
import datetime, sys, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
print("rank 0 started", flush=True)
torch.tensor(torch.ones(2))
try:
    dist.TCPStore("127.0.0.1", 1, is_master=False, timeout=datetime.timedelta(seconds=1))
except RuntimeError:
    pass


def train():
    raise RuntimeError("the same fault on every rank")


train()
"""


@pytest.fixture(scope="module")
def rank_text(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The lines of one real rank: stdout first, then stderr, as its log would hold them."""
    folder = tmp_path_factory.mktemp("rank")
    (folder / "rank.py").write_text(RANK)
    done = subprocess.run(
        [sys.executable, folder / "rank.py", folder / "store"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1 and "[rank0]: RuntimeError: the same fault on every rank" in done.stderr, done.stderr
    # c10's log line with its timestamp: a warning or an error, by how the store's connection timed out
    assert re.search(r"^\[rank0\]:\[[WE]\d{4} ", done.stderr, re.M), done.stderr
    assert "[rank0]:     train()" in done.stderr.splitlines(), done.stderr  # a frame's source line
    return (done.stdout + done.stderr).splitlines()


def as_rank(lines: list[str], rank: int, draw: random.Random) -> list[str]:
    """LINES as RANK would print them: torch's "[rankN]:", and its own addresses of C++ frames (ASLR)."""
    ours = [
        line.replace("[rank0]", f"[rank{rank}]").replace("rank 0 started", f"rank {rank} started") for line in lines
    ]
    return [re.sub(r"0x[0-9a-f]{8,}", lambda _: hex(draw.getrandbits(44) | 1 << 44), line) for line in ours]


def run(shown: frozenset[int] | None, streams: dict[int, list[str]], order: list[int]) -> list[str]:
    """The console of the ranks' STREAMS, interleaved in ORDER (a rank's next line at each of its entries)."""
    out, con, at = io.BytesIO(), Console(shown), dict.fromkeys(streams, 0)
    for rank in order:
        con.line(f"{rank}: {streams[rank][at[rank]]}\n".encode(), out)
        at[rank] += 1
    con.tick(end=True)
    return out.getvalue().decode().splitlines()


def interleaving(streams: dict[int, list[str]], draw: random.Random) -> list[int]:
    order = [rank for rank, lines in streams.items() for _ in lines]
    draw.shuffle(order)  # each rank's own lines stay in their order: the Nth entry of a rank is its Nth line
    return order


@settings(max_examples=60, deadline=None)
@given(world=st.integers(2, 48), seed=st.integers(0, 2**32), odd=st.integers(1, 46))
def test_every_line_many_ranks_print_comes_once_and_a_ranks_own_warning_names_it(
    rank_text: list[str], world: int, seed: int, odd: int
):
    draw, odd = random.Random(seed), 1 + odd % max(1, world - 2)
    streams = {rank: as_rank(rank_text, rank, draw) for rank in range(world)}
    own = f"/x/recipe.py:9: UserWarning: only rank {odd} warns this"
    if odd < world - 1:
        streams[odd] = [*streams[odd][:2], own, *streams[odd][2:]]
    console_lines = run(shown_ranks("", world), streams, interleaving(streams, draw))

    said = [same_text(line.split(": ", 1)[1].encode()) for line in console_lines]
    for line in set(map(same_text, (line.encode() for line in rank_text))):  # what every rank printed: once a time
        assert 1 <= said.count(line) <= [same_text(mine.encode()) for mine in rank_text].count(line), line
    assert console_lines.count(f"{odd}: {own}") == (odd < world - 1)
    assert all(line.startswith(("0: ", f"{world - 1}: ", f"{odd}: {own}")) for line in console_lines), console_lines


def test_a_fault_of_some_ranks_comes_as_one_traceback_naming_them(rank_text: list[str]):
    draw = random.Random(7)
    traceback = [line for line in rank_text if line.startswith("[rank0]: ")]
    streams = {rank: as_rank(rank_text if rank in (3, 4, 5, 9) else rank_text[:1], rank, draw) for rank in range(16)}
    console_lines = run(shown_ranks("", 16), streams, interleaving(streams, draw))

    shown = [f"ranks 3-5,9: {line.removeprefix('[rank0]: ')}" for line in traceback]
    start = console_lines.index(shown[0])
    assert console_lines[start : start + len(shown)] == shown, console_lines


def test_a_line_of_another_rank_waits_a_moment_for_the_ranks_that_print_it_too():
    out, con = io.BytesIO(), Console(shown_ranks("", 8))
    for rank in (4, 2):
        con.line(f"{rank}: [W1207 06:45:47.57{rank} TCPStore.cpp:340] [c10d] retrying\n".encode(), out)
    con.tick()
    assert out.getvalue() == b""
    time.sleep(console.WINDOW_S)
    con.tick()
    con.line(b"5: [W1207 06:45:49.1 TCPStore.cpp:340] [c10d] retrying\n", out)  # later: in its log only
    con.tick(end=True)
    assert out.getvalue() == b"ranks 2,4: [W TCPStore.cpp:340] [c10d] retrying\n"


def test_a_traceback_cut_short_by_the_ranks_end_is_shown_as_far_as_it_came():
    out, con = io.BytesIO(), Console(shown_ranks("0", 4))
    for line in ("Traceback (most recent call last):", '  File "/x/train.py", line 3, in <module>'):
        con.line(f"2: {line}\n".encode(), out)
    con.tick(end=True)
    assert out.getvalue().decode().splitlines() == [
        "2: Traceback (most recent call last):",
        '2:   File "/x/train.py", line 3, in <module>',
    ]


def test_a_shown_rank_that_repeats_a_line_shows_it_each_time():
    out, con = io.BytesIO(), Console(shown_ranks("", 2))
    for line in (b"0: ---\n", b"1: ---\n", b"0: ---\n"):
        con.line(line, out)
    assert out.getvalue() == b"0: ---\n0: ---\n"


@given(st.lists(st.binary(max_size=40).map(lambda line: line.replace(b"\n", b"") + b"\n"), max_size=30))
def test_all_shows_every_line_as_the_ranks_printed_it(lines: list[bytes]):
    out, con = io.BytesIO(), Console(shown_ranks("all", 8))
    for line in lines:
        con.line(line, out)
    con.tick(end=True)
    assert out.getvalue() == b"".join(lines)


@pytest.mark.parametrize(
    ("spec", "world", "ranks"),
    [("", 8, {0, 7}), ("", 1, {0}), ("0-3,100", 8, {0, 1, 2, 3}), ("5", 8, {5}), ("6-99", 8, {6, 7})],
)
def test_a_rank_list_names_the_ranks_of_the_job_it_holds(spec: str, world: int, ranks: set[int]):
    assert shown_ranks(spec, world) == ranks


@pytest.mark.parametrize("spec", ["8-15", "3-1", "99"])
def test_a_rank_list_that_names_no_rank_of_the_job_is_refused(spec: str):
    with pytest.raises(UsageError, match=rf"^SRUNSH_CONSOLE_RANKS={spec} names no rank of this job \(ranks 0-7\)"):
        shown_ranks(spec, 8)
