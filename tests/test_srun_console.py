"""What a person reads on the console of a launch, run as a user would: on the two-node test SLURM with 2 x 4 ranks,
interactive and as a batch job, and with --local. Every rank runs tests/fixtures/warning_recipe.py's configure()
(tests/fixtures/configure_python stands in for entrypoint.py): it prints "rank R started", warns as every rank does,
and rank 6 warns once more, its own warning; Python's warnings module words both."""

import re
from pathlib import Path

from tests.srun_world import ALLOCATION, FIXTURES, SrunWorld
from tests.test_srun_batch import batch_log, submit, wait_job_ended

pytest_plugins = ["tests.srun_world"]

COMMON, OWN = "UserWarning: every rank warns the same", "UserWarning: only rank 6 warns this"


def warning_world(world: SrunWorld) -> SrunWorld:
    (world.dir / "recipe.py").write_text((FIXTURES / "warning_recipe.py").read_text())
    world.env["SRUNSH_PYTHON"] = str(FIXTURES / "configure_python")
    return world


def assert_reads_as_one_rank(console: str) -> None:
    """Ranks 0 and 7 speak for the job; the common warning once, rank 6's own once, naming it."""
    lines = console.splitlines()
    assert {"0: rank 0 started", "7: rank 7 started"} <= set(lines), console
    assert not [line for line in lines if re.fullmatch(r"[1-6]: rank \d started", line)], console
    assert len([line for line in lines if COMMON in line]) == 1, console
    assert [line for line in lines if OWN in line] == [f"6: recipe.py:14: {OWN}"], console


def assert_every_rank_log_has_all_its_lines(run_dir: Path) -> None:
    for rank in range(8):
        log = (run_dir / "logs" / f"rank-{rank}.log").read_text().splitlines()
        own = [f"recipe.py:14: {OWN}", '  warnings.warn(f"only rank {rank} warns this", stacklevel=1)']
        expected = [f"rank {rank} started", f"recipe.py:12: {COMMON}", *(own if rank == 6 else [])]
        expected.append('  warnings.warn("every rank warns the same", stacklevel=1)')
        assert sorted(log) == sorted(expected), (rank, log)


def test_the_console_of_eight_ranks_shows_a_warning_of_all_once_and_one_ranks_own_naming_it(slurm_world: SrunWorld):
    world = warning_world(slurm_world)
    result, steps = world.in_allocation("--no-container", "recipe.py", salloc=ALLOCATION)

    assert result.returncode == 0, result.stderr
    assert steps == 1
    assert_reads_as_one_rank(result.stdout + result.stderr)
    (run_dir,) = world.run_dirs()
    assert_every_rank_log_has_all_its_lines(run_dir)


def test_a_batch_jobs_log_reads_as_the_console(slurm_world: SrunWorld):
    world = warning_world(slurm_world)
    job = submit(world, *ALLOCATION)
    wait_job_ended(world, job)

    assert_reads_as_one_rank(batch_log(world, job))
    assert_every_rank_log_has_all_its_lines(world.dir / "outputs" / "recipe" / job)


def test_the_knob_shows_the_ranks_it_names_or_all(srun_world: SrunWorld):
    world = warning_world(srun_world)  # --local: four ranks, as CUDA_VISIBLE_DEVICES shows four GPUs
    some = world.srun_sh("--local", "recipe.py", env={"SRUNSH_CONSOLE_RANKS": "1-2"})
    every = world.srun_sh("--local", "recipe.py", env={"SRUNSH_CONSOLE_RANKS": "all"})

    assert some.returncode == every.returncode == 0, some.stderr + every.stderr
    started = {line for line in some.stdout.splitlines() if "started" in line}
    assert started == {"1: rank 1 started", "2: rank 2 started"}
    assert len([line for line in some.stderr.splitlines() if COMMON in line]) == 1, some.stderr
    assert {f"{rank}: rank {rank} started" for rank in range(4)} <= set(every.stdout.splitlines())
    assert len([line for line in every.stderr.splitlines() if COMMON in line]) == 4, every.stderr
