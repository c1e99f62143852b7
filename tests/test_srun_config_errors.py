"""A bad NAME=VALUE with the real entrypoint.py: every rank finds it before distributed init, srun.sh prints it once,
as the last line, exits 2, and leaves no rank behind (two nodes of the test SLURM, and --local)."""

import sys

from tests.conftest import REPO
from tests.srun_world import SrunWorld

pytest_plugins = ["tests.srun_world"]

TINY = str(REPO / "recipes" / "tiny_gpt_pretrain.py")
TYPO = "model.tensor_model_paralel_size=2"
ERROR = (
    "entrypoint.py: error: unknown config key 'model.tensor_model_paralel_size' ('model' has no key"
    " 'tensor_model_paralel_size'); did you mean 'model.tensor_model_parallel_size'?"
)
REAL_PYTHON = {"SRUNSH_PYTHON": sys.executable, "HF_HUB_OFFLINE": "1"}


def assert_reported_once(stderr: str) -> None:
    lines = stderr.splitlines()
    assert lines[-1] == ERROR
    assert [line for line in lines if "error" in line.lower() and "UserWarning" not in line] == [ERROR]


def test_misspelt_key_on_two_nodes_is_one_line_and_exit_2(slurm_world: SrunWorld):
    result, _ = slurm_world.in_allocation(
        "--no-container", TINY, TYPO, salloc=("--nodes=2", "--gpus-per-node=1"), env=REAL_PYTHON, timeout=300
    )

    assert result.returncode == 2, result.stderr[-3000:]
    assert_reported_once(result.stderr)


def test_misspelt_key_with_local_ranks_is_one_line_and_exit_2(srun_world: SrunWorld):
    result = srun_world.srun_sh("--local", TINY, TYPO, env={**REAL_PYTHON, "SRUNSH_GPUS_PER_NODE": "2"}, timeout=300)

    assert result.returncode == 2, result.stderr[-3000:]
    assert_reported_once(result.stderr)
    (run_dir,) = (srun_world.dir / "outputs" / "tiny_gpt_pretrain").iterdir()
    assert (run_dir / "logs" / "usage-error").read_text() == ERROR + "\n"
