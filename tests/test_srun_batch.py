"""srun.sh --sbatch on the two-node test SLURM: submit, save before the time limit and requeue, resume after
`scontrol requeue`, stop requeueing a job that keeps failing, and name the first failure in the job's log.

The ranks are tests/fixtures/fake_python with FAKE_CHECKPOINT=1: a stand-in for Megatron Bridge's checkpoints and its
exit signal handler (a marker in RUN_DIR/checkpoints, saved and exit 0 on SIGTERM)."""

import json
import re
import time

import pytest

from tests.srun_world import SRUN_SH, SrunWorld

pytest_plugins = ["tests.srun_world"]

CHECKPOINTS = {"FAKE_CHECKPOINT": "1", "FAKE_SLEEP": "300", "FAKE_SLEEP_RESUMED": "0"}
ONE_NODE = ("--nodes=1", "--gpus-per-node=1")


def submit(world: SrunWorld, *sbatch: str, env: dict[str, str] | None = None, launch: tuple[str, ...] = ()) -> str:
    result = world.on_login_node(
        [str(SRUN_SH), "--sbatch", *sbatch, "--", "--no-container", "recipe.py", *launch], env=env
    )
    assert result.returncode == 0, result.stderr
    match = re.fullmatch(r"srun\.sh: submitted batch job (\d+): run (\S+), outputs in (\S+)/, .*\n", result.stdout)
    assert match, result.stdout
    job, run_id, run_dir = match.groups()
    assert run_id == job
    assert run_dir == str(world.dir / "outputs" / "recipe" / job)
    return job


def job_state(world: SrunWorld, job: str) -> str:
    return world.on_login_node(["squeue", "--noheader", "--jobs", job, "--format=%T"]).stdout.strip()


def wait_until(what: str, ready, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout}s: {what}")


def wait_job_ended(world: SrunWorld, job: str, timeout: float = 120) -> None:
    wait_until(f"job {job} ended", lambda: job_state(world, job) == "", timeout)


def batch_log(world: SrunWorld, job: str) -> str:
    return (world.dir / "outputs" / "recipe" / f"slurm-{job}.out").read_text()


def restart_of(record: dict) -> str:
    return record["env"].get("SLURM_RESTART_COUNT", "0")


def test_submitted_job_runs_the_launch_as_run_job_id_and_says_where_its_outputs_are(slurm_world: SrunWorld):
    job = submit(slurm_world, "--nodes=2", "--gpus-per-node=2", launch=("a=b c",))
    wait_job_ended(slurm_world, job)

    records = slurm_world.records()
    assert sorted(records) == [0, 1, 2, 3]
    run_dir = slurm_world.dir / "outputs" / "recipe" / job
    for rank, record in records.items():
        assert record["env"]["RUN_ID"] == job
        assert record["argv"][1:] == [
            b"recipe.py",
            b"a=b c",
            b"train.exit_signal_handler=true",
            b"train.exit_signal_handler_for_dataloader=true",
        ]
        assert (run_dir / "logs" / f"rank-{rank}.log").read_text() == f"rank {rank} started\n"
    assert f"new run {job} in {run_dir}" in batch_log(slurm_world, job)


def test_time_limit_ends_in_a_save_and_a_requeue_that_resumes(slurm_world: SrunWorld):
    # SLURM's own USR1: slurmctld looks at time limits every 30 s and signals at the first look that finds the job
    # within SAVE_LEAD_S + 30 s of its end, so a 1-minute job with 15 s gets it 15-45 s after each start: after the
    # first run's training started, and never before the resumed run (a few seconds of work) has ended.
    job = submit(slurm_world, *ONE_NODE, "--time=1", env={**CHECKPOINTS, "SRUNSH_SAVE_LEAD_S": "15"})
    wait_job_ended(slurm_world, job, timeout=240)

    (record,) = slurm_world.records().values()
    assert restart_of(record) == "1"
    assert record["resumed_from"] == f"run={job} restart=0 saved at SIGTERM"
    log = batch_log(slurm_world, job)
    assert "reaches its time limit in 15s" in log
    assert "saved before the time limit (exit status 0): requeueing job" in log
    history = (slurm_world.dir / "outputs" / "recipe" / job / "logs" / "requeues.log").read_text()
    assert len(history.splitlines()) == 1 and "restart 0: saved before the time limit" in history
    # Each attempt's goodput line; the last covers both (the stand-in ranks record no step: all start-up).
    run = json.loads((slurm_world.dir / "outputs" / "recipe" / job / "goodput.json").read_text())
    assert [attempt["ended"] for attempt in run["attempts"]] == ["requeued", "completed"]
    said = [re.search(r"goodput: no training step completed in (\d+) s", line) for line in log.splitlines()]
    walls = [int(match[1]) for match in said if match]
    assert len(walls) == 2 and abs(walls[1] - run["total"]["wall_s"]) <= 1 and walls[1] >= walls[0]  # whole seconds
    spans = sum(attempt["end"] - attempt["start"] for attempt in run["attempts"])
    assert (
        abs(run["total"]["wall_s"] - spans) < 0.01
        and run["total"]["wall_s"] > run["attempts"][0]["end"] - run["attempts"][0]["start"]
    )


def test_scontrol_requeue_mid_run_resumes_the_same_run(slurm_world: SrunWorld):
    job = submit(slurm_world, *ONE_NODE, env=CHECKPOINTS)
    wait_until("rank 0 started", lambda: 0 in slurm_world.records(), 60)
    assert slurm_world.records()[0]["resumed_from"] is None

    requeued = slurm_world.on_login_node(["scontrol", "requeue", job])
    assert requeued.returncode == 0, requeued.stderr
    wait_job_ended(slurm_world, job, timeout=180)

    (record,) = slurm_world.records().values()
    assert restart_of(record) == "1"
    assert record["resumed_from"].startswith(f"run={job} restart=0 ")
    assert record["env"]["RUN_DIR"] == str(slurm_world.dir / "outputs" / "recipe" / job)


def test_requeue_bound_stops_a_job_that_keeps_failing(slurm_world: SrunWorld):
    job = submit(slurm_world, *ONE_NODE, env={"SRUNSH_MAX_RETRIES": "1", "FAKE_FAIL_RANK": "0", "FAKE_FAIL_EXIT": "5"})
    wait_job_ended(slurm_world, job, timeout=180)

    assert len(slurm_world.calls()) == 2  # the first attempt and one retry
    log = batch_log(slurm_world, job)
    assert "failed with exit status 5: requeueing job" in log
    assert (
        f"job {job} failed, and is not requeued: it was requeued after 1 failure(s) already (SRUNSH_MAX_RETRIES=1)"
        in log
    )


def test_first_failure_report_in_the_job_log_names_rank_and_host(slurm_world: SrunWorld):
    env = {"SRUNSH_MAX_RETRIES": "0", "FAKE_FAIL_RANK": "3", "FAKE_FAIL_EXIT": "7", "FAKE_SLEEP": "300"}
    job = submit(slurm_world, "--nodes=2", "--gpus-per-node=2", env=env)
    wait_job_ended(slurm_world, job)

    log = batch_log(slurm_world, job)
    assert "srun.sh: rank 3 on node2 failed first, with exit status 7; the end of" in log
    assert "    rank 3 fails now" in log.splitlines()


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--nodes=1", "--"], {}, "no recipe given"),
        (["--nodes=1", "recipe.py"], {}, "--sbatch takes sbatch options, then -- and the launch"),
        (
            ["--bogus", "--", "--no-container", "recipe.py"],
            {},
            "sbatch refused the job: sbatch: unrecognized option '--bogus'",
        ),
        (
            ["--time=4", "--", "--no-container", "recipe.py"],
            {},
            "time limit 4 (240 s) leaves no time before the save SRUNSH_SAVE_LEAD_S=300",
        ),
        (
            ["-t", "0-0:5", "--", "--no-container", "recipe.py"],
            {"SRUNSH_SAVE_LEAD_S": "600"},
            "time limit 0-0:5 (300 s) leaves no time",
        ),
        (["--nodes=1", "--", "--local", "recipe.py"], {}, "--local runs without SLURM, so it cannot be a batch job"),
        (["--nodes=1", "--", "missing.py"], {}, "recipe missing.py is not a readable file"),
        (["--nodes=1", "--", "recipe.py"], {"SRUNSH_MAX_RETRIES": "x"}, "SRUNSH_MAX_RETRIES=x is not a count"),
    ],
    ids=[
        "no recipe",
        "no --",
        "unknown sbatch option",
        "time limit in minutes",
        "time limit d-h:m",
        "local",
        "recipe not found",
        "bad retries",
    ],
)
def test_bad_batch_input_fails_before_submitting_with_one_line(
    slurm_world: SrunWorld, args: list[str], env: dict[str, str], says: str
):
    result = slurm_world.on_login_node([str(SRUN_SH), "--sbatch", *args], env=env)

    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and says in result.stderr, result.stderr
    assert slurm_world.cluster.job_ids() == []
    assert not (slurm_world.dir / "outputs").exists()
