"""What a launch saves (issue 67): a batch job and a launch with in-process restart save without being asked
(asynchronous persistent checkpoints, local ones on each node's SRUNSH_LOCAL_CKPT_DIR), the command line wins, a
recipe's positive interval is kept, the header and --dry-run say it, bad input is refused before anything starts, and
the intervals left open are chosen from each save's measured cost (Young/Daly)."""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from megatron.bridge.training.config import CheckpointConfig

import entrypoint
from launcher.checkpoints import defaults, intervals
from launcher.checkpoints.plan import ONE_NODE_MTBF_S
from launcher.errors import UsageError
from launcher.host.plan import LaunchPlan
from tests.conftest import REPO
from tests.srun_world import SrunWorld

pytest_plugins = ["tests.srun_world"]

TINY = str(REPO / "recipes" / "tiny_gpt_pretrain.py")


@pytest.fixture
def keeping_work(monkeypatch, tmp_path):
    """A rank's environment as srun.sh sets it for an in-process-restart launch, beside common unrelated variables."""
    env = {
        "RUN_DIR": str(tmp_path / "run"),
        "RUN_ID": "4242-20261207-101500",
        "SRUNSH_KEEP_WORK": "1",
        "SRUNSH_LOCAL_CKPT_DIR": str(tmp_path / "nvme"),
        "SRUNSH_MTBF_S": "86400",
        "TMPDIR": str(tmp_path),
        "OMP_NUM_THREADS": "4",
        "PYTHONUNBUFFERED": "1",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return tmp_path


def resolve(*argv: str):
    return entrypoint.resolve(entrypoint.parse_args([TINY, *argv]))


def test_a_launch_that_keeps_work_keeps_the_recipes_interval_and_puts_local_checkpoints_on_the_nodes_disk(
    keeping_work,
):
    cfg, applied = resolve()
    assert (cfg.checkpoint.save_interval, cfg.checkpoint.non_persistent_ckpt_type) == (500, None)  # the recipe's
    assert defaults.to_choose(cfg, set(applied)) == set()
    cfg, applied = resolve("checkpoint.non_persistent_ckpt_type=local")
    mine = f"srunsh-local-ckpt-uid{os.getuid()}"
    assert cfg.checkpoint.non_persistent_local_ckpt_dir == str(keeping_work / "nvme" / mine / "4242-20261207-101500")
    assert defaults.to_choose(cfg, set(applied)) == {"non_persistent_save_interval"}
    line = defaults.describe(cfg, {"non_persistent_save_interval"})
    assert "every 500 step(s); local checkpoints on each node's" in line and line.endswith("measured cost is worth")


def test_an_interactive_launchs_local_checkpoints_go_to_the_nodes_disk_too(keeping_work, monkeypatch):
    """What a launch of the same SRUNSH_RUN_ID on the same nodes reads back (tests/gpu/test_resume.py)."""
    monkeypatch.setenv("SRUNSH_KEEP_WORK", "0")
    cfg, applied = resolve("checkpoint.non_persistent_ckpt_type=local", "checkpoint.non_persistent_save_interval=3")
    mine = f"srunsh-local-ckpt-uid{os.getuid()}"
    assert cfg.checkpoint.non_persistent_local_ckpt_dir == str(keeping_work / "nvme" / mine / "4242-20261207-101500")
    assert defaults.to_choose(cfg, set(applied)) == set()  # only a launch that keeps work chooses intervals


LOCAL_TYPES = st.sampled_from(["local", "null"]).map(lambda value: f"checkpoint.non_persistent_ckpt_type={value}")
OTHERS = st.sampled_from(["train.train_iters=7", "checkpoint.save_interval=9", "checkpoint.async_save=false"])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(LOCAL_TYPES, OTHERS), max_size=4, unique_by=lambda text: text.split("=")[0]))
def test_the_container_mounts_the_local_directory_exactly_when_the_ranks_config_keeps_local_checkpoints(
    keeping_work, monkeypatch, command_line
):
    """The launching host's reading of the overrides (pyxis_mounts) against the rank's own (the real config)."""
    monkeypatch.setenv("SRUNSH_KEEP_WORK", "0")
    cfg, _ = resolve(*command_line)
    plan = LaunchPlan(local_ckpt_dir="/nvme", overrides=command_line)
    assert ("/nvme:/nvme" in plan.pyxis_mounts.split(",")) is (cfg.checkpoint.non_persistent_ckpt_type == "local")


def test_an_interval_the_recipe_leaves_open_is_chosen_while_training(keeping_work):
    cfg, applied = resolve("checkpoint.save_interval=null", "checkpoint.non_persistent_ckpt_type=local")
    assert defaults.to_choose(cfg, set(applied)) == {"non_persistent_save_interval"}  # the command line's null wins
    cfg.checkpoint.save_interval = 0  # as a recipe that sets none
    assert defaults.to_choose(cfg, set()) == {"save_interval", "non_persistent_save_interval"}


CHOICES = {
    "checkpoint.save_interval": st.sampled_from(["0", "7", "1000"]),
    "checkpoint.async_save": st.sampled_from(["true", "false"]),
    "checkpoint.non_persistent_ckpt_type": st.sampled_from(["null", "local"]),
    "checkpoint.non_persistent_save_interval": st.sampled_from(["0", "5"]),
}
READ = {"true": True, "false": False, "null": None}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.fixed_dictionaries({}, optional=CHOICES))
def test_whatever_the_command_line_sets_wins_0_and_null_included(keeping_work, command_line):
    cfg, applied = resolve(*(f"{key}={value}" for key, value in command_line.items()))
    for key, value in command_line.items():
        assert getattr(cfg.checkpoint, key.split(".")[1]) == READ.get(value, int(value) if value.isdigit() else value)
    assert not {f"checkpoint.{kind}" for kind in defaults.to_choose(cfg, set(applied))} & set(command_line)


def test_a_bare_entrypoint_ignores_the_knobs_a_host_exports_for_srun_sh(keeping_work, monkeypatch):
    monkeypatch.delenv("RUN_DIR")
    cfg, _ = resolve()
    assert (cfg.checkpoint.async_save, cfg.checkpoint.non_persistent_ckpt_type) == (False, None)
    assert defaults.describe(cfg, set()).startswith("saves persistent checkpoints synchronously")


def test_local_checkpoints_of_a_format_that_holds_no_sharded_state_or_without_a_folder_are_refused(
    keeping_work, monkeypatch
):
    with pytest.raises(UsageError, match=r"holds Megatron Core's sharded state, which .*=fsdp_dtensor is not: "):
        resolve("use_megatron_fsdp=true", "checkpoint.non_persistent_ckpt_type=local")
    monkeypatch.delenv("RUN_DIR")  # a bare entrypoint.py: no SRUNSH_LOCAL_CKPT_DIR
    with pytest.raises(UsageError, match=r"non_persistent_ckpt_type=local has no directory: launch it with srun.sh"):
        resolve("checkpoint.non_persistent_ckpt_type=local")


def test_an_asynchronous_save_turned_on_by_the_command_line_gets_the_strategy_the_config_class_gives_it(keeping_work):
    """Megatron Bridge 0.6.2's CheckpointConfig sets async_strategy=mcore when it is built with async_save off, as the
    recipes build it; an override turning async_save on later kept mcore, whose writer drops the local checkpoints'
    requests (nvidia-resiliency-ext's AsyncRequest is not Megatron Core's): they never completed, and the run's end
    waited on them for ever (bench/results/goodput.md, docs/failures.md)."""
    cfg, _ = resolve()
    assert (cfg.checkpoint.async_save, cfg.checkpoint.async_strategy) == (False, "mcore")  # the recipe's, untouched
    assert CheckpointConfig(async_save=True).async_strategy == "nvrx"
    cfg, _ = resolve("checkpoint.async_save=true", "checkpoint.non_persistent_ckpt_type=local")
    assert (cfg.checkpoint.async_save, cfg.checkpoint.async_strategy) == (True, "nvrx")


def test_local_checkpoints_written_by_the_strategy_that_drops_them_are_refused_in_one_line(keeping_work):
    local = ("checkpoint.async_save=true", "checkpoint.non_persistent_ckpt_type=local")
    with pytest.raises(UsageError, match=r"^checkpoint\.async_strategy=mcore never writes local checkpoints .*: drop"):
        resolve(*local, "checkpoint.async_strategy=mcore")
    cfg, _ = resolve(local[0], "checkpoint.async_strategy=mcore")  # persistent ones only: the user's choice
    assert cfg.checkpoint.async_strategy == "mcore"


def test_an_asynchronous_save_of_a_format_that_cannot_is_refused_in_one_line(keeping_work):
    with pytest.raises(UsageError, match=r"async_save=true cannot save checkpoint\.ckpt_format=torch: .* set "):
        resolve("checkpoint.ckpt_format=torch", "checkpoint.async_save=true")


def test_nothing_saved_says_a_failure_loses_every_step(keeping_work):
    cfg, _ = resolve("checkpoint.save_interval=0", "checkpoint.non_persistent_ckpt_type=null")
    assert "a failure loses every step" in defaults.describe(cfg, set())


# ---- The intervals chosen while training --------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(st.floats(0.05, 5.0), min_size=12, max_size=40),
    local_s=st.floats(0.01, 30.0),
    persistent_s=st.floats(0.01, 60.0),
    mtbf=st.floats(60.0, 1e7),
)
def test_each_interval_is_daly_optimum_over_the_median_step_from_each_saves_measured_cost(
    monkeypatch, steps, local_s, persistent_s, mtbf
):
    """A save holds the step after it (synchronous: its write; asynchronous: its copy to host memory, the write then
    in the background, its on_checkpoint_save steps later, which the choice must not wait for)."""
    clock = Clock()
    monkeypatch.setattr(intervals.time, "monotonic", clock.monotonic)
    chooser = intervals.Intervals({"save_interval", "non_persistent_save_interval"}, mtbf)
    ckpt = CheckpointConfig(save="/ckpt", save_interval=None)
    context = SimpleNamespace(state=SimpleNamespace(cfg=SimpleNamespace(checkpoint=ckpt), train_state=None))
    chooser.on_train_start(context)
    saves: list[tuple[int, str]] = []
    held, kind = 0.0, None
    for index, seconds in enumerate(steps):
        clock.now += seconds + held
        context.state.train_state = SimpleNamespace(step=index)
        chooser.on_step_end(context)
        if kind == intervals.PERSISTENT:  # chosen now: a persistent save covers what local ones cannot, the rarer one
            local = chooser.chosen[intervals.LOCAL]
            assert chooser.chosen[kind] >= intervals.PERSISTENT_OVER_LOCAL * local
        held = 0.0
        if (kind := chooser.saving) is not None:
            saves.append((index + 1, kind))
            held = local_s if kind == intervals.LOCAL else persistent_s

    assert saves[:2] == [(3, intervals.LOCAL), (4, intervals.PERSISTENT)]
    median = statistics.median(steps[1:3])  # the steps timed before the first save: 2 and 3
    cost = max(steps[3] + local_s - median, 0.0)  # step 4, which the save after step 3 held
    local_steps = max(1, round(intervals.optimum_s(cost, mtbf) / median))
    assert chooser.chosen[intervals.LOCAL] >= 1 and intervals.PERSISTENT in chooser.chosen
    if len(saves) == 2:  # no save after the probes: the first choice stands
        assert chooser.chosen[intervals.LOCAL] == local_steps
    assert intervals.optimum_s(local_s, mtbf) >= local_s
    assert math.isclose(intervals.optimum_s(2.0, 1e6), math.sqrt(4e6) - 2.0)


# ---- The launching host: knobs, header, dry run ----------------------------------------------------------------


def dry_run(world: SrunWorld, *args: str, env: dict[str, str] | None = None):
    return world.srun_sh("--dry-run", "--local", "recipe.py", *args, env={"SRUNSH_GPUS_PER_NODE": "1", **(env or {})})


def exported(stdout: str) -> dict[str, str]:
    pairs = (line.removeprefix("export ").split("=", 1) for line in stdout.splitlines() if line.startswith("export "))
    return dict(pairs)


def test_dry_run_of_an_inprocess_restart_launch_says_what_it_saves_and_hands_the_ranks_the_knobs(
    srun_world: SrunWorld,
):
    nvme = srun_world.dir / "nvme"
    result = dry_run(srun_world, "inprocess_restart.enabled=true", env={"SRUNSH_LOCAL_CKPT_DIR": str(nvme)})
    assert result.returncode == 0, result.stderr
    env = exported(result.stdout)
    assert (env["SRUNSH_KEEP_WORK"], env["SRUNSH_LOCAL_CKPT_DIR"]) == ("1", str(nvme))
    assert env["SRUNSH_MTBF_S"] == f"{ONE_NODE_MTBF_S:.0f}"
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("# saves persistent checkpoints")]
    assert f"local ones on each node's {nvme}" in line and "a fault every" in line
    assert srun_world.calls() == []


def test_a_batch_jobs_dry_run_says_what_the_job_saves_by_default(srun_world: SrunWorld):
    nvme, sbatch = srun_world.dir / "nvme", ("--sbatch", "-N", "2", "-t", "1:00:00", "--", "--dry-run")
    for mtbf, faults in (("", "Llama 3's fault rate over the job's nodes"), ("3600", "a fault every 3600 s")):
        env = {"SRUNSH_LOCAL_CKPT_DIR": str(nvme), "SRUNSH_MTBF_S": mtbf}
        result = srun_world.srun_sh(*sbatch, "--no-container", "recipe.py", env=env)
        assert result.returncode == 0, result.stderr
        (line,) = [line for line in result.stdout.splitlines() if line.startswith("# the job saves persistent ")]
        assert f"worth against {faults} (SRUNSH_MTBF_S); checkpoint.non_persistent_ckpt_type=local adds" in line
        assert f"local ones on each node's {nvme}" in line
    assert srun_world.calls() == []


def test_an_interactive_launch_keeps_the_recipes_choice_and_says_when_a_failure_loses_every_step(
    srun_world: SrunWorld,
):
    plain = dry_run(srun_world)
    assert exported(plain.stdout)["SRUNSH_KEEP_WORK"] == "0"
    assert not [line for line in plain.stdout.splitlines() if "saves" in line]
    nothing = dry_run(srun_world, "checkpoint.save_interval=0")
    assert "# saves no checkpoint (checkpoint.save_interval=0 on the command line): a failure loses every step" in (
        nothing.stdout.splitlines()
    )
    local = dry_run(
        srun_world, "checkpoint.non_persistent_ckpt_type=local", "checkpoint.non_persistent_save_interval=5"
    )
    assert any("a launch of the same SRUNSH_RUN_ID on the same nodes" in line for line in local.stdout.split("\n"))


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("SRUNSH_LOCAL_CKPT_DIR", "nvme", "is not off or an absolute path"),
        ("SRUNSH_LOCAL_CKPT_DIR", "/a b", "is not off or an absolute path"),
        ("SRUNSH_MTBF_S", "0", "is not a positive number of seconds"),
        ("SRUNSH_MTBF_S", "1d", "is not a positive number of seconds"),
    ],
)
def test_a_bad_knob_is_refused_in_one_line_before_anything_starts(srun_world: SrunWorld, name, value, says):
    result = srun_world.srun_sh("--local", "recipe.py", "inprocess_restart.enabled=true", env={name: value})
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"srun.sh: {name}=") and says in line
    assert srun_world.calls() == [] and srun_world.run_dirs() == []


def test_a_node_without_the_local_checkpoint_directory_fails_its_ranks_in_one_line(srun_world: SrunWorld):
    missing = srun_world.dir / "no-nvme"
    env = {"SRUNSH_GPUS_PER_NODE": "1", "SRUNSH_LOCAL_CKPT_DIR": str(missing)}
    result = srun_world.srun_sh("--local", "recipe.py", "inprocess_restart.enabled=true", env=env)
    assert result.returncode == 2, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "cannot keep local checkpoints" in line]
    assert str(missing) in line and "SRUNSH_LOCAL_CKPT_DIR must be a writable directory on every node" in line
    assert srun_world.calls() == []
    assert not Path(missing).exists()
