"""bench/bench_turns.py's plans: the arms every plan builds, and every arm's config checked with the real Megatron
Bridge classes as entrypoint.py --check checks it, so that none is refused on the GPU host."""

import pytest

import entrypoint
from bench import bench_turns, launches
from tests.conftest import REPO

PLAN_ARMS = {
    (name, gpus): bench_turns.arms(plan, gpus, settle=1) for name, plan in bench_turns.PLANS.items() for gpus in (1, 2)
}


def keys(overrides: tuple[str, ...]) -> list[str]:
    return [override.split("=", 1)[0] for override in overrides]


@pytest.mark.parametrize("plan", bench_turns.PLANS.values())
def test_every_arm_a_block_names_is_built_once_and_plays_in_consecutive_blocks(plan: bench_turns.Plan):
    """bench/turns.py stops an arm when it leaves its block: one that came back would start again in its folder."""
    arms = bench_turns.arms(plan, gpus=1, settle=1)
    for name in arms:
        present = [index for index, block in enumerate(plan.blocks) if name in block]
        assert present == list(range(present[0], present[-1] + 1)), name
    for block in plan.blocks:
        assert set(block) <= set(arms) and len(set(block)) == len(block), block


@pytest.mark.parametrize(("plan", "gpus"), PLAN_ARMS)
def test_every_plan_builds_arms_that_share_a_schedule_and_can_be_stopped(plan: str, gpus: int):
    arms = PLAN_ARMS[(plan, gpus)]
    iterations = set()
    for arm in arms.values():
        assert len(keys(arm.overrides)) == len(set(keys(arm.overrides))), arm.name  # the launches refuse duplicates
        assert set(bench_turns.STOPPABLE) <= set(arm.overrides) and set(launches.MEASURED) <= set(arm.overrides)
        iterations |= {o for o in arm.overrides if o.startswith("train.train_iters=")}
        assert arm.command[-len(arm.overrides) :] == arm.overrides
        assert arm.env == {"SRUNSH_GPUS_PER_NODE": str(gpus)}
    assert len(iterations) == 1  # one LR schedule for every arm, so that their losses compare


def test_the_ab_arms_differ_by_the_launcher_and_the_noise_arm_by_its_seed_alone():
    ab = PLAN_ARMS[("llama8b-ab", 2)]
    assert ab["upstream"].command[:3] == (launches.sys.executable, "-m", "torch.distributed.run")
    assert "--nproc-per-node=2" in ab["upstream"].command and ab["upstream"].overrides == ab["ours"].overrides
    assert ab["ours"].command[:2] == (str(REPO / "srun.sh"), "--local")
    assert "model.num_layers=4" in ab["ours"].overrides and "train.global_batch_size=16" in ab["ours"].overrides
    assert ab["ours"].tokens_per_step == 16 * 8192
    assert ab["seed"].noise_of == "ours" and set(ab["seed"].overrides) - set(ab["ours"].overrides) == {"rng.seed=4321"}


def test_the_shapes_the_tokens_per_step_come_from_are_the_recipes():
    for recipe, sequence in bench_turns.SEQUENCE.items():
        cfg = entrypoint.load_recipe(REPO / recipe).configure()
        assert (cfg.model.seq_length, cfg.dataset.seq_length) == (sequence, sequence), recipe
    tiny = entrypoint.load_recipe(REPO / launches.TINY).configure()
    assert tiny.train.global_batch_size == bench_turns.TINY_GLOBAL_BATCH


def test_upstream_arms_alive_together_get_ports_of_their_own():
    for arms in PLAN_ARMS.values():
        ports = [c for arm in arms.values() for c in arm.command if c.startswith("--master-port=")]
        assert len(ports) == len(set(ports))


CONFIGS = {
    f"{plan}/{arm.name}/{gpus}": (arm.recipe, arm.overrides, gpus)
    for (plan, gpus), arms in PLAN_ARMS.items()
    for arm in arms.values()
    if arm.name != "upstream"  # the same recipe and overrides as ours
}


@pytest.mark.parametrize("label", CONFIGS)
def test_every_arm_config_passes_entrypoints_check(label: str, output_root, capsys):
    recipe, overrides, gpus = CONFIGS[label]
    assert entrypoint.main([str(REPO / recipe), *overrides, "--check", "--world-size", str(gpus)]) == 0, (
        capsys.readouterr().err[-2000:]
    )


def test_every_plan_has_a_note_and_a_reference_in_every_block():
    for plan in bench_turns.PLANS.values():
        assert plan.note and all(len(block) >= 1 for block in plan.blocks)
