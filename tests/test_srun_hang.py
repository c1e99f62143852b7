"""srun.sh's hang report, on the two-node test SLURM and with --local: a stand-in training rank stuck in a collective
or in Python is named in RUN_DIR/hang-report.txt, with its host, whether SIGTERM stops the launch or
SRUNSH_HANG_TIMEOUT_S does; a hang at start names the rank that never joined; a rank that cannot answer (SIGSTOP) is
named first, with its host and what the launching host sees of it; a stop of a job that was progressing, also at
moments drawn at random (HANG_TEST_SEED repeats a draw), blames nobody.

The ranks are tests/fixtures/fake_python with FAKE_STEPS: each installs the real launcher/hang/dumps.py and records
its steps with the real launcher/hang/progress.py, so srun.sh's watch, its SIGUSR2 to every process of the step, the
stacks (faulthandler), torch's flight recorder (gloo's) and the report are all the product's own. FAKE_STUCK picks
the rank that sticks, and how: that is the stand-in's only part.
"""

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.srun_world import REPO, SrunWorld, wait_gone

pytest_plugins = ["tests.srun_world"]

REPORT_PY = REPO / "launcher" / "hang" / "report.py"
TRAINING = {"SRUNSH_GPUS_PER_NODE": "2", "FAKE_STEPS": "100000", "FAKE_STEP_S": "0.1"}


def hang_report(world: SrunWorld) -> str:
    (run_dir,) = world.run_dirs()
    return (run_dir / "hang-report.txt").read_text()


def summary(stderr: str) -> list[str]:
    """srun.sh's three lines about the hang."""
    lines = stderr.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("srun.sh: hang report ("))
    print(*lines[first : first + 3], sep="\n")  # shown when a test fails
    return lines[first : first + 3]


def wait_for_step(world: SrunWorld, step: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        progress = [path for run_dir in world.run_dirs() for path in [run_dir / "hang" / "progress.json"]]
        if progress and progress[0].exists() and f'"step": {step},' in progress[0].read_text():
            return
        time.sleep(0.1)
    raise AssertionError(f"no step {step} within {timeout}s")


def processes_of(run_dir: Path) -> list[int]:
    """This host's processes that name the run directory: the hang report, a rank."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(run_dir).encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def stop(proc, pid_file: Path | None, sig: signal.Signals) -> str:
    try:
        os.kill(int(pid_file.read_text()) if pid_file else proc.pid, sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return stderr


def test_sigterm_names_the_rank_stuck_in_another_collective_and_its_node(slurm_world: SrunWorld):
    env = {**TRAINING, "FAKE_STUCK": "3:collective@3"}
    proc, pid_file = slurm_world.start_in_allocation("--no-container", "recipe.py", env=env)
    wait_for_step(slurm_world, 2)
    time.sleep(1)  # rank 3 is in its all-reduce of ranks 2-3, the others in the step's all-reduce
    stderr = stop(proc, pid_file, signal.SIGTERM)

    assert proc.returncode == 143, stderr
    first, second, third = summary(stderr)
    assert first.startswith("srun.sh: hang report (srun.sh got SIGTERM): ranks 0-2 wait in gloo:all_reduce #")
    assert first.endswith("of process group 0 (default_pg, ranks 0-3); 1 rank(s) not in it")
    assert re.fullmatch(
        r"srun.sh:   not in it: rank 3 on node2 \(pid \d+\): it waits in gloo:all_reduce #1 of .*", second
    )
    (run_dir,) = slurm_world.run_dirs()
    assert third == f"srun.sh:   every rank's top frames and torch's analysis: {run_dir}/hang-report.txt"
    report = hang_report(slurm_world)
    assert "Ranks: 4 on 2 host(s); stacks from 4, answers from 4, flight recorder records from 4" in report
    assert re.search(r"rank 3 on node2 \(pid \d+\), last step 2\n      all_reduce \(distributed_c10d\.py", report)
    assert "stuck_in_collective (fake_python:" in report  # every rank answered: the report came before the stop


def test_hang_timeout_names_the_rank_stuck_in_python_and_stops_the_job(slurm_world: SrunWorld):
    env = {**TRAINING, "FAKE_STUCK": "3:python@3", "SRUNSH_HANG_TIMEOUT_S": "3"}
    started = time.monotonic()
    result, _ = slurm_world.in_allocation("--no-container", "recipe.py", env=env)

    assert result.returncode == 124, result.stderr
    assert time.monotonic() - started < 60
    first, second, _ = summary(result.stderr)
    assert first.startswith(
        "srun.sh: hang report (no training step completed for 3 s after step 2 (SRUNSH_HANG_TIMEOUT_S=3)):"
        " ranks 0-2 wait"
    )
    assert re.fullmatch(
        r"srun.sh:   not in it: rank 3 on node2 \(pid \d+\): at stuck_in_python \(fake_python:\d+\)", second
    )
    assert "not in it: rank 3 on node2" in hang_report(slurm_world)
    assert "failed first" not in result.stderr  # the hang report said it all


def wait_for_ranks(world: SrunWorld, count: int, timeout: float = 60) -> None:
    """Until `count` ranks registered their hang handler."""
    deadline = time.monotonic() + timeout
    while len(list(world.dir.glob("outputs/recipe/*/hang/rank-*.json"))) < count:
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.1)


def test_stall_at_start_names_the_rank_that_never_joined_and_a_stop_then_blames_nobody(srun_world: SrunWorld):
    """The hang watch's report (--stalled, made here: its own limit before the first step is 20 min) names the rank;
    srun.sh's at the SIGTERM a second after the start, when that rank may just be slow to import, names nobody."""
    env = {**TRAINING, "FAKE_STUCK": "1:start"}
    proc = srun_world.start("--local", "recipe.py", env=env)
    wait_for_ranks(srun_world, 2)
    time.sleep(1)  # rank 0 waits in the rendezvous for rank 1
    records = srun_world.records()
    (run_dir,) = srun_world.run_dirs()
    host = os.uname().nodename
    report = [sys.executable, str(REPORT_PY), str(run_dir), "--why", "no step for 1200 s"]
    where = ["--world-size", "2", "--nodes", host, "--ranks-per-node", "2", "--local", "--stalled"]
    stalled = subprocess.run([*report, *where], capture_output=True, text=True, timeout=60, check=True)
    stderr = stop(proc, None, signal.SIGTERM)

    first, second, _ = summary(stalled.stderr)
    assert first == (
        "srun.sh: hang report (no step for 1200 s): hang at start: 1 rank(s) never joined torch.distributed;"
        " rank 0 waits for them in the rendezvous"
    )
    assert re.fullmatch(rf"srun.sh:   never joined: rank 1 on {host} \(pid \d+\): at stuck_in_python .*", second)
    assert proc.returncode == 143, stderr
    first, _, _ = summary(stderr)
    assert STARTING.search(first), first
    assert "Start: not every rank joined" not in hang_report(srun_world)
    assert wait_gone([record["pid"] for record in records.values()], timeout=10)
    assert wait_gone(processes_of(srun_world.run_dirs()[0]), timeout=10)


def test_hang_timeout_with_local_names_the_rank_stuck_in_another_collective(srun_world: SrunWorld):
    env = {**TRAINING, "SRUNSH_GPUS_PER_NODE": "3", "FAKE_STUCK": "2:collective@3", "SRUNSH_HANG_TIMEOUT_S": "3"}
    result = srun_world.srun_sh("--local", "recipe.py", env=env, timeout=120)

    assert result.returncode == 124, result.stderr
    first, second, _ = summary(result.stderr)
    assert " ranks 0-1 wait in gloo:all_reduce #" in first and first.endswith("; 1 rank(s) not in it")
    assert second.startswith(f"srun.sh:   not in it: rank 2 on {os.uname().nodename} (pid ")
    assert "it waits in gloo:all_reduce #1" in second
    assert all(wait_gone([record["pid"]], timeout=10) for record in srun_world.records().values())
    assert wait_gone(processes_of(srun_world.run_dirs()[0]), timeout=10)


# ---- A stop of a progressing job, and a rank that cannot answer (issue 35) ----------------------------------------

WHOLE_NODES = {**TRAINING, "SRUNSH_GPUS_PER_NODE": "4"}  # the test cluster's two nodes x 4 ranks
# Words of a diagnosis: none of them may appear about a job that was progressing.
BLAME = ("not in it", "suspect", "network", "never started", "stuck", "never joined", "did not answer")
PROGRESSING = re.compile(r"training was progressing: last step (\d+), (\d+(?:\.\d+)?) s before the stop")
STARTING = re.compile(
    r"(stopped during start-up: no training step had completed|stopped before the second step: step 1 had completed),"
    r" \d+ s after the launch; nothing is blamed \(a stop is not a stall\)$"
)


def assert_blames_nobody(stderr: str, report: str) -> None:
    first, second, _ = summary(stderr)
    assert PROGRESSING.search(first) or STARTING.search(first), first
    for word in BLAME:
        assert word not in first + second, (word, first, second)
        assert word not in report, (word, report)


# SIGHUP (a closed terminal, a dropped ssh) stops the launch as SIGTERM does.
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_stop_while_training_progresses_says_so_and_blames_nobody(slurm_world: SrunWorld, sig: signal.Signals):
    proc, pid_file = slurm_world.start_in_allocation("--no-container", "recipe.py", env=WHOLE_NODES)
    wait_for_step(slurm_world, 5)
    stderr = stop(proc, pid_file, sig)

    assert proc.returncode == 128 + sig, stderr
    first, _, _ = summary(stderr)
    progressing = f"srun.sh: hang report (srun.sh got {sig.name}): training was progressing: last step "
    assert first.startswith(progressing), first
    assert_blames_nobody(stderr, hang_report(slurm_world))
    assert "Ranks: 8 on 2 host(s); stacks from 8, answers from 8, flight recorder records from 8" in hang_report(
        slurm_world
    )


def sigstop_at_step(world: SrunWorld, rank: int, step: int) -> int:
    """SIGSTOP to `rank` once step `step` completed, as a frozen process or a debugger would leave it; its pid."""
    wait_for_step(world, step)
    (run_dir,) = world.run_dirs()
    pid = int(json.loads((run_dir / "hang" / f"rank-{rank}.json").read_text())["pid"])
    os.kill(pid, signal.SIGSTOP)
    return pid


def continue_after_the_report(world: SrunWorld, pid: int, timeout: float = 60) -> None:
    """SIGCONT once the report is written, so that the stopped rank takes the SIGTERM that follows without waiting
    for the launcher's SIGKILL."""
    deadline = time.monotonic() + timeout
    while not any((run_dir / "hang-report.txt").exists() for run_dir in world.run_dirs()):
        assert time.monotonic() < deadline, "no hang report"
        time.sleep(0.2)
    time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):  # slurmstepd continues a stopped task it signals: it may be gone
        os.kill(pid, signal.SIGCONT)


def test_hang_timeout_names_the_stopped_rank_on_the_other_node_first(slurm_world: SrunWorld):
    env = {**WHOLE_NODES, "SRUNSH_HANG_TIMEOUT_S": "3"}
    proc, _ = slurm_world.start_in_allocation("--no-container", "recipe.py", env=env)
    pid = sigstop_at_step(slurm_world, 5, 3)
    continue_after_the_report(slurm_world, pid)
    _, stderr = proc.communicate(timeout=120)

    assert proc.returncode == 124, stderr
    first, second, _ = summary(stderr)
    assert re.fullmatch(
        r"srun.sh: hang report \(no training step completed for 3 s after step \d+ \(SRUNSH_HANG_TIMEOUT_S=3\)\):"
        rf" 1 rank\(s\) did not answer: rank 5 on node2 \(pid {pid}\): no answer from node node2"
        r" \(ranks 4,6-7 on it answered\)",
        first,
    ), first
    assert "rank(s) not in it" in second, second  # the others wait for it in the step's all-reduce


@pytest.mark.parametrize("world_size", [1, 2])
def test_hang_timeout_with_local_names_the_stopped_rank_and_its_state_first(srun_world: SrunWorld, world_size: int):
    """One rank is the case of the issue: the report said '0 of 1 answered' and 'no stacks came'."""
    env = {**TRAINING, "SRUNSH_GPUS_PER_NODE": str(world_size), "SRUNSH_HANG_TIMEOUT_S": "3"}
    proc = srun_world.start("--local", "recipe.py", env=env)
    stopped = world_size - 1
    pid = sigstop_at_step(srun_world, stopped, 3)
    continue_after_the_report(srun_world, pid)
    _, stderr = proc.communicate(timeout=120)

    assert proc.returncode == 124, stderr
    first, _, _ = summary(stderr)
    host = os.uname().nodename
    assert first.endswith(f": 1 rank(s) did not answer: rank {stopped} on {host} (pid {pid}): stopped (T)"), first


def wait_past_step(world: SrunWorld, step: int, timeout: float = 60) -> None:
    """Until rank 0 recorded step `step` or a later one (fast steps go by between two looks)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run_dir in world.run_dirs():
            try:
                if json.loads((run_dir / "hang" / "progress.json").read_text())["step"] >= step:
                    return
            except (OSError, ValueError):
                pass
        time.sleep(0.1)
    raise AssertionError(f"no step {step} within {timeout}s")


def training_step_id(world: SrunWorld, timeout: float = 30) -> str:
    """The SLURM step id of srun.sh's training step. squeue is asked again while it shows none: on a loaded machine
    slurmctld can miss squeue's timeout, and squeue then prints nothing on stdout."""
    deadline = time.monotonic() + timeout
    while True:
        result = world.on_login_node(["squeue", "--noheader", "--steps", "--format=%i %j"])
        steps = [line.split()[0] for line in result.stdout.split("\n") if " srunsh-" in line]
        if len(steps) == 1:
            return steps[0]
        assert time.monotonic() < deadline, f"no one srunsh step in squeue: {result.stdout!r} {result.stderr!r}"
        time.sleep(0.5)


def report_now(world: SrunWorld, step: str, ranks_per_node: int) -> tuple[str, str]:
    """The hang report of the running job's step `step`, made from the login node as srun.sh makes it at a stop; its
    console lines and its file. The job goes on."""
    (run_dir,) = world.run_dirs()
    arguments = ["--world-size", str(2 * ranks_per_node), "--nodes", "node1,node2"]
    command = [
        "python3",
        str(REPORT_PY),
        str(run_dir),
        "--why",
        "srun.sh got SIGTERM",
        *arguments,
        "--ranks-per-node",
        str(ranks_per_node),
        "--step",
        step,
    ]
    result = world.on_login_node(command)
    assert result.returncode == 0, result.stderr
    return result.stderr, hang_report(world)


def test_reports_at_random_moments_of_a_progressing_job_blame_nobody(slurm_world: SrunWorld):
    """Stacks and flight recorder records taken when the code did not choose: steps short enough that most of a
    step is its all-reduce, so that the ranks are caught entering, inside and leaving it."""
    seed = int(os.environ.get("HANG_TEST_SEED", time.time_ns() % 2**32))
    chooser = random.Random(seed)
    print(f"HANG_TEST_SEED={seed}")
    proc, pid_file = slurm_world.start_in_allocation(
        "--no-container", "recipe.py", env={**WHOLE_NODES, "FAKE_STEP_S": "0.02"}
    )
    try:
        wait_past_step(slurm_world, 10)
        step = training_step_id(slurm_world)
        for _ in range(5):
            time.sleep(chooser.uniform(0.0, 1.0))
            assert_blames_nobody(*report_now(slurm_world, step, ranks_per_node=4))
        time.sleep(chooser.uniform(0.0, 1.0))
    except BaseException:
        proc.kill()
        raise
    stderr = stop(proc, pid_file, signal.SIGTERM)

    assert proc.returncode == 143, stderr
    assert_blames_nobody(stderr, hang_report(slurm_world))


# ---- A stop before a step time is known --------------------------------------------------------------------------


def test_sigterm_during_the_start_up_all_reduce_says_so_and_blames_nobody(slurm_world: SrunWorld):
    """The most common Ctrl-C: ranks 0-6 done loading wait in the start-up all-reduce for rank 7 (20 s), which the
    report took for a rank not in it."""
    proc, pid_file = slurm_world.start_in_allocation(
        "--no-container", "recipe.py", env={**WHOLE_NODES, "FAKE_START_S": "20"}
    )
    wait_for_ranks(slurm_world, 8)
    time.sleep(5)  # the first ranks have joined torch.distributed and wait in the all-reduce
    stderr = stop(proc, pid_file, signal.SIGTERM)

    assert proc.returncode == 143, stderr
    first, second, _ = summary(stderr)
    assert first.startswith("srun.sh: hang report (srun.sh got SIGTERM): stopped during start-up: no training step")
    assert second == (
        "srun.sh:   an ordinary stop: 8 of 8 ranks answered; the hang watch would call it a stall after 1200 s"
    )
    report = hang_report(slurm_world)
    assert_blames_nobody(stderr, report)
    assert re.search(r"gloo:all_reduce #\d+ of process group 0 .*, entered \d+\.\d s before the request", report)


def test_stops_at_random_moments_of_start_up_and_training_blame_nobody(slurm_world: SrunWorld):
    """One stop, at a moment drawn across the start-up all-reduce and the first seconds of training."""
    seed = int(os.environ.get("HANG_TEST_SEED", time.time_ns() % 2**32))
    at = random.Random(seed).uniform(0.0, 8.0)
    print(f"HANG_TEST_SEED={seed}: the stop {at:.2f} s after the ranks registered")
    env = {**WHOLE_NODES, "FAKE_START_S": "4", "FAKE_STEP_S": "0.02"}
    proc, pid_file = slurm_world.start_in_allocation("--no-container", "recipe.py", env=env)
    wait_for_ranks(slurm_world, 8)
    time.sleep(at)
    stderr = stop(proc, pid_file, signal.SIGTERM)

    assert proc.returncode == 143, stderr
    assert_blames_nobody(stderr, hang_report(slurm_world))
