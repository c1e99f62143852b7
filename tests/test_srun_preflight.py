"""srun.sh with the real entrypoint.py as its pre-flight, inside a real SLURM allocation: a bad override is one line
on stderr, exit 2, and no job step; a good one passes the check and reaches the ranks."""

import sys

from tests.slurm_cluster import REPO, SrunWorld

pytest_plugins = ["tests.slurm_cluster"]

TINY = str(REPO / "recipes" / "tiny_gpt_pretrain.py")


def test_misspelt_key_stops_the_launch_before_any_job_step(slurm_world: SrunWorld):
    result, steps = slurm_world.in_allocation(
        "--no-container", TINY, "model.tensor_model_paralel_size=2", env={"PYTHON": sys.executable}, timeout=180
    )
    assert result.returncode == 2
    assert result.stderr == (
        "entrypoint.py: error: unknown config key 'model.tensor_model_paralel_size' ('model' has no key"
        " 'tensor_model_paralel_size'); did you mean 'model.tensor_model_parallel_size'?\n"
    )
    assert steps == 0, "a job step started"


def test_dry_run_prints_the_rank_command_after_a_real_check(slurm_world: SrunWorld):
    result = slurm_world.srun_sh(
        "--dry-run",
        "--local",
        TINY,
        "train.train_iters=5",
        env={"PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "0"},
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert "entrypoint.py" in result.stdout and "train.train_iters=5" in result.stdout
