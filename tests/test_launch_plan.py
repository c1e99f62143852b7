"""The launch plan: what the launching host settled is written once, as RUN_DIR/launch-plan.json, readable by its
owner only, and it is what the ranks were given (their environment, their arguments byte for byte)."""

import json
import os

from tests.srun_world import HOSTILE_ARGS, SrunWorld

pytest_plugins = ["tests.srun_world"]


def test_a_local_launch_writes_the_plan_its_ranks_were_started_with(srun_world: SrunWorld):
    result = srun_world.srun_sh("--local", "recipe.py", *HOSTILE_ARGS, env={"SRUNSH_GPUS_PER_NODE": "2"})

    assert result.returncode == 0, result.stderr
    (run_dir,) = srun_world.run_dirs()
    path = run_dir / "launch-plan.json"
    assert path.stat().st_mode & 0o777 == 0o600
    plan = json.loads(path.read_text())
    assert (plan["run_id"], plan["hosts"], plan["ranks_per_node"]) == (run_dir.name, [os.uname().nodename], 2)
    assert plan["overrides"] == HOSTILE_ARGS
    for rank, record in srun_world.records().items():
        env = record["env"]
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (plan["master_addr"], plan["master_port"])
        assert (env["RUN_DIR"], env["WORLD_SIZE"], env["RANK"]) == (str(run_dir), "2", str(rank))


def test_a_dry_run_writes_no_plan_and_takes_no_run(srun_world: SrunWorld):
    result = srun_world.srun_sh("--dry-run", "--local", "recipe.py", env={"SRUNSH_GPUS_PER_NODE": "1"})

    assert result.returncode == 0, result.stderr
    assert srun_world.run_dirs() == []
