"""srun.sh --nsys: exactly the ranks the pre-flight names (profile_ranks=) run under nsys, one report per job, host
and rank, and Megatron Bridge's own nsys switch is turned on unless the user set it. tests/fixtures/fake_nsys stands
in for nsys: it records its arguments and runs the rank command."""

import socket

from tests.slurm_cluster import FIXTURES, SrunWorld

pytest_plugins = ["tests.slurm_cluster"]

NSYS_FLAGS = [
    "profile",
    "-t",
    "cuda,nvtx",
    "-s",
    "none",
    "--cpuctxsw=none",
    "--capture-range=cudaProfilerApi",
    "--capture-range-end=stop",
    "--enable",
    "efa_metrics",
    "--force-overwrite=true",
    "-o",
]


def nsys_env(**extra: str) -> dict[str, str]:
    return {"NSYS": str(FIXTURES / "fake_nsys"), **extra}


def test_local_nsys_wraps_exactly_the_profile_ranks(srun_world: SrunWorld):
    env = nsys_env(GPUS_PER_NODE="3", FAKE_PROFILE_RANKS="0,2")
    result = srun_world.srun_sh("--nsys", "--local", "recipe.py", "a=1", env=env)

    assert result.returncode == 0, result.stderr
    assert sorted(srun_world.records()) == [0, 1, 2]
    nsys = srun_world.nsys_records()
    assert sorted(nsys) == [0, 2]
    run_id = srun_world.records()[0]["env"]["RUN_ID"]
    host = socket.gethostname().split(".")[0]
    for rank, record in nsys.items():
        output = f"nsys-megatron/{run_id}/profile-{host}-rank{rank}"
        assert record["argv"][: len(NSYS_FLAGS) + 1] == [*NSYS_FLAGS, output]
        command = record["argv"][len(NSYS_FLAGS) + 1 :]
        assert command[0] == str(FIXTURES / "fake_python")
        assert command[2:] == ["recipe.py", "a=1", "profiling.use_nsys_profiler=true"]


def test_nsys_switch_is_appended_once_and_never_over_a_user_value(srun_world: SrunWorld):
    env = nsys_env(GPUS_PER_NODE="1")
    appended = srun_world.srun_sh("--nsys", "--local", "recipe.py", env=env)
    assert appended.returncode == 0, appended.stderr
    assert srun_world.records()[0]["argv"][1:] == [b"recipe.py", b"profiling.use_nsys_profiler=true"]
    check = next(call for call in srun_world.calls() if call["check"])
    assert bytes.fromhex(check["argv_hex"][-1]) == b"profiling.use_nsys_profiler=true"

    user_set = srun_world.srun_sh("--nsys", "--local", "recipe.py", "profiling.use_nsys_profiler=false", env=env)
    assert user_set.returncode == 0, user_set.stderr
    assert srun_world.records()[0]["argv"][1:] == [b"recipe.py", b"profiling.use_nsys_profiler=false"]


def test_without_nsys_option_no_rank_is_wrapped(srun_world: SrunWorld):
    result = srun_world.srun_sh("--local", "recipe.py", env=nsys_env(GPUS_PER_NODE="2", FAKE_PROFILE_RANKS="0,1"))

    assert result.returncode == 0, result.stderr
    assert srun_world.nsys_records() == {}
    assert all(b"profiling.use_nsys_profiler=true" not in r["argv"] for r in srun_world.records().values())


def test_slurm_nsys_wraps_the_profile_ranks_with_job_host_and_rank_in_the_report_path(slurm_world: SrunWorld):
    env = nsys_env(GPUS_PER_NODE="4", FAKE_PROFILE_RANKS="1,3", NSYS_OUTPUT_DIR="profiles")
    result, steps = slurm_world.in_allocation("--nsys", "--no-container", "recipe.py", env=env)

    assert result.returncode == 0, result.stderr
    assert steps == 1
    assert sorted(slurm_world.records()) == [0, 1, 2, 3]
    nsys = slurm_world.nsys_records()
    assert sorted(nsys) == [1, 3]
    job_id = slurm_world.records()[0]["env"]["SLURM_JOB_ID"]
    for rank, record in nsys.items():
        assert record["argv"][len(NSYS_FLAGS)] == f"profiles/{job_id}/profile-{slurm_world.cluster.node}-rank{rank}"
        assert (slurm_world.dir / "profiles" / job_id).is_dir()
