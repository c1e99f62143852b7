"""launcher/restart/exit_after_failure.py with Megatron Bridge's own pretrain(): training raises, and its clean-up
after the error never returns (as the abort of the process groups did on the H200); the rank still exits, with the
error and one line that says why it exits, in a second or so rather than at srun.sh's hang watch."""

import contextlib
import logging
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.restart import exit_after_failure
from tests.conftest import REPO

# The real _pretrain() on the tiny recipe's config, with setup() failing (it stands for any error in training) and the
# clean-up replaced by one that blocks, as the hung abort did.
RANK = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {repo!r})
    import entrypoint
    from megatron.bridge.training import pretrain
    from megatron.bridge.training.state import GlobalState
    from launcher.restart import exit_after_failure

    def failing_setup(*args, **kwargs):
        raise {error}

    pretrain.setup = failing_setup
    pretrain._cleanup_after_pretrain_failure = lambda state, destroy: time.sleep(600)
    {install}
    state = GlobalState()
    state.cfg = entrypoint.load_recipe(entrypoint.Path({recipe!r})).configure()
    pretrain._pretrain(state, forward_step_func=None)
    """
)


# Megatron Bridge's pretrain logger's line for the error, after which its clean-up runs (and here hangs).
FAILURE_LINE = "Pretrain failed on rank="
# How long the control holds after that line: more than a rank whose clean-up returns needs to exit after it (seconds
# on an idle machine; 26 s measured on 2 cores at load 18, where a 10 s hold passed with the clean-up not hanging).
HOLD_S = 60.0
# How long the rank may take to get there: about 11 s on an idle machine; minutes on a loaded one.
REACH_FAILURE_S = 900.0


ERROR = 'RuntimeError("Modules must not have hooks registered at the time they are passed")'
# What Megatron Bridge's train() raises once it has saved after a SIGTERM, or at train.exit_interval: sys.exit(0).
OWN_EXIT = "SystemExit(0)"


def rank_script(tmp_path, install: str, error: str = ERROR) -> str:
    script = tmp_path / "rank.py"
    recipe = str(REPO / "recipes" / "tiny_gpt_pretrain.py")
    script.write_text(RANK.format(repo=str(REPO), recipe=recipe, install=install, error=error))
    return str(script)


def run_rank(
    tmp_path, install: str, timeout_s: float, error: str = ERROR
) -> tuple[subprocess.CompletedProcess | None, float]:
    script = rank_script(tmp_path, install, error)
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return None, time.monotonic() - started
    return done, time.monotonic() - started


def test_a_rank_whose_clean_up_after_an_error_hangs_exits_after_the_grace_time(tmp_path):
    done, _ = run_rank(tmp_path, "exit_after_failure.install(grace_s=1)", timeout_s=120)

    assert done is not None, "the rank did not exit"
    assert done.returncode == 1
    assert "Pretrain failed on rank=" in done.stderr and "Modules must not have hooks registered" in done.stderr
    assert done.stderr.rstrip().endswith(
        "entrypoint.py: Megatron Bridge's clean-up after the error above did not return in 1 s: the rank exits 1"
    )


def test_a_rank_whose_training_exits_on_purpose_exits_with_that_status_and_is_not_called_failed(tmp_path):
    """Megatron Bridge logs its own sys.exit(0) after a save as "Pretrain failed" and runs the same clean-up: the
    rank says at once that it did not fail, and leaves after the short grace with status 0, not 1 after 60 s."""
    done, _ = run_rank(
        tmp_path, "exit_after_failure.install(grace_s=600, exit_grace_s=1)", timeout_s=120, error=OWN_EXIT
    )

    assert done is not None, "the rank did not exit"
    assert done.returncode == 0, done.stderr[-3000:]
    assert FAILURE_LINE in done.stderr and "SystemExit: 0" in done.stderr  # Megatron Bridge's own lines
    assert (
        'entrypoint.py: training ended by its own sys.exit(0); Megatron Bridge logs that as "Pretrain failed": it is'
        " not one" in done.stderr
    )
    assert done.stderr.rstrip().endswith(
        "entrypoint.py: Megatron Bridge's clean-up after training's exit did not return in 1 s: the rank exits 0,"
        " as training chose"
    )
    assert "did not return in 600 s" not in done.stderr


@settings(max_examples=25, deadline=None)
@given(code=st.one_of(st.none(), st.integers(0, 255), st.text(alphabet="abc xyz", max_size=8)))
def test_the_status_a_system_exit_chooses_is_the_one_python_exits_with(code):
    """The interpreter is the oracle: the status chosen_exit_status() reads from a SystemExit is the one python
    itself exits with for sys.exit(code)."""
    try:
        raise SystemExit(code)
    except SystemExit:
        record = logging.LogRecord("pretrain", logging.ERROR, __file__, 0, "failed", None, sys.exc_info())
    python = subprocess.run([sys.executable, "-c", f"import sys; sys.exit({code!r})"], capture_output=True, check=False)

    assert exit_after_failure.chosen_exit_status(record) == python.returncode


def test_other_errors_choose_no_status():
    try:
        raise RuntimeError("a training error")
    except RuntimeError:
        record = logging.LogRecord("pretrain", logging.ERROR, __file__, 0, "failed", None, sys.exc_info())
    assert exit_after_failure.chosen_exit_status(record) is None
    assert (
        exit_after_failure.chosen_exit_status(
            logging.LogRecord("p", logging.ERROR, __file__, 0, "no error", None, None)
        )
        is None
    )


def read_stderr(rank: subprocess.Popen, stderr: list[str], failed: threading.Event) -> threading.Thread:
    """A thread that keeps RANK's stderr in STDERR and sets FAILED at Megatron Bridge's failure line."""

    def read() -> None:
        for line in rank.stderr:
            stderr.append(line)
            if FAILURE_LINE in line:
                failed.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader


def wait_for_failure_line(rank: subprocess.Popen, failed: threading.Event, stderr: list[str]) -> None:
    deadline = time.monotonic() + REACH_FAILURE_S
    while not failed.wait(timeout=0.5) and rank.poll() is None and time.monotonic() < deadline:
        pass
    assert failed.is_set(), f"no {FAILURE_LINE!r} line (exit {rank.poll()}): {''.join(stderr)[-3000:]}"


# A rank watched from outside from Megatron Bridge's failure line on: its exit status (None: it still ran at the end of
# the watch), the seconds from that line to its exit or to the end of the watch, and its stderr.
Watched = tuple[int | None, float, str]


def watch(script: str, seconds: float) -> Watched:
    """The rank of SCRIPT, watched for SECONDS from its failure line on (it takes about 11 s to get there), then
    killed."""
    failed = threading.Event()
    stderr: list[str] = []
    status = None
    with subprocess.Popen(
        [sys.executable, script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as rank:
        reader = read_stderr(rank, stderr, failed)
        try:
            wait_for_failure_line(rank, failed, stderr)
            seen = time.monotonic()
            with contextlib.suppress(subprocess.TimeoutExpired):
                status = rank.wait(timeout=seconds)
            waited = time.monotonic() - seen
        finally:
            rank.kill()
            rank.wait()
        reader.join(timeout=10)
    return status, waited, "".join(stderr)


# The grace that entrypoint.py's install() gives a rank whose clean-up after a training error hangs.
DEFAULT_GRACE_S = 60.0


@pytest.fixture
def hanging_clean_ups(once, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Watched]:
    """The two ranks whose clean-up hangs that the tests below watch for a minute each, watched at the same time (a
    minute, not two, of a test worker), once a session: "without", with no exit_after_failure, for HOLD_S; "default",
    with it installed as entrypoint.py installs it, until DEFAULT_GRACE_S + 10 s."""

    def watch_both() -> dict[str, Watched]:
        folder = tmp_path_factory.mktemp("hanging_clean_ups")
        (folder / "without").mkdir()
        (folder / "default").mkdir()
        without = rank_script(folder / "without", "")
        default = rank_script(folder / "default", "exit_after_failure.install()")
        with ThreadPoolExecutor(2) as pool:
            watches = pool.submit(watch, without, HOLD_S), pool.submit(watch, default, DEFAULT_GRACE_S + 10)
            return {"without": watches[0].result(), "default": watches[1].result()}

    return once("failure-exit-hanging-clean-ups", watch_both)


def test_without_it_the_rank_stays(hanging_clean_ups: dict[str, Watched]):
    """The condition the module is for: Megatron Bridge's pretrain() does not return while its clean-up hangs. The
    rank is watched from its failure line on, for HOLD_S."""
    status, _, said = hanging_clean_ups["without"]
    assert status is None, f"the rank exited {status} without the fix: {said[-3000:]}"


def test_a_rank_whose_clean_up_after_an_error_hangs_exits_after_the_default_grace_not_later(
    hanging_clean_ups: dict[str, Watched],
):
    """The rank, installed as entrypoint.py installs it, is timed from outside from Megatron Bridge's failure line
    (its record starts the grace) to its exit."""
    status, waited, said = hanging_clean_ups["default"]
    assert status == 1, f"exit status {status} {waited:.1f} s after the failure line: {said[-3000:]}"
    assert waited > DEFAULT_GRACE_S - 10, f"the rank exited {waited:.1f} s after the failure line"
    assert said.rstrip().endswith(
        "entrypoint.py: Megatron Bridge's clean-up after the error above did not return in 60 s: the rank exits 1"
    )
