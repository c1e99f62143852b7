"""bench/levers.py and bench/arm_check.py: the arms every plan builds, and every arm's config checked with the real
Megatron Bridge classes as entrypoint.py --check checks it, so that none is refused on the device."""

import dataclasses

import pytest
from megatron.core.transformer.transformer_config import TransformerConfig

import entrypoint
from bench import arm_check, launches, levers, turns
from tests.conftest import REPO

PLAN_ARMS = {(name, gpus): levers.arms(plan, gpus, settle=1) for name, plan in levers.PLANS.items() for gpus in (1, 2)}


def keys(overrides: tuple[str, ...]) -> list[str]:
    return [override.split("=", 1)[0] for override in overrides]


@pytest.mark.parametrize(("plan", "gpus"), PLAN_ARMS)
def test_every_plan_builds_arms_that_share_a_schedule_and_can_be_stopped(plan: str, gpus: int):
    arms = PLAN_ARMS[(plan, gpus)]
    turns.check_plan(arms, levers.blocks(levers.PLANS[plan]))
    iterations = set()
    for arm in arms.values():
        assert len(keys(arm.overrides)) == len(set(keys(arm.overrides))), arm.name  # the launches refuse duplicates
        assert set(levers.STOPPABLE) <= set(arm.overrides) and set(launches.MEASURED) <= set(arm.overrides)
        iterations |= {o for o in arm.overrides if o.startswith("train.train_iters=")}
        assert arm.command[-len(arm.overrides) :] == arm.overrides
        assert arm.env["SRUNSH_GPUS_PER_NODE"] == str(gpus)
    assert len(iterations) == 1  # one LR schedule for every arm, so that their losses compare


def test_lever_arms_change_what_they_say_and_nothing_else():
    arms = PLAN_ARMS[("llama8b-levers", 1)]
    ours = set(arms["ours"].overrides)
    assert "model.num_layers=4" in ours and "train.global_batch_size=8" in ours
    assert set(arms["gbs16"].overrides) ^ ours == {"train.global_batch_size=8", "train.global_batch_size=16"}
    assert arms["gbs16"].tokens_per_step == 2 * arms["ours"].tokens_per_step == 16 * 8192
    assert arms["cudnn_norms"].command == arms["ours"].command
    assert arms["cudnn_norms"].env == {
        "SRUNSH_GPUS_PER_NODE": "1",
        "NVTE_NORM_FWD_USE_CUDNN": "1",
        "NVTE_NORM_BWD_USE_CUDNN": "1",
    }
    assert str(REPO / levers.LLAMA_BF16) in arms["bf16"].command
    ab = PLAN_ARMS[("llama8b-ab", 2)]
    assert ab["upstream"].command[:3] == (launches.sys.executable, "-m", "torch.distributed.run")
    assert "--nproc-per-node=2" in ab["upstream"].command and "train.global_batch_size=16" in ab["ours"].overrides
    assert ab["seed"].noise_of == "ours" and set(ab["seed"].overrides) - set(ab["ours"].overrides) == {"rng.seed=4321"}


def test_the_shapes_the_tokens_per_step_come_from_are_the_recipes():
    for recipe, sequence in levers.SEQUENCE.items():
        cfg = entrypoint.load_recipe(REPO / recipe).configure()
        assert (cfg.model.seq_length, cfg.dataset.seq_length) == (sequence, sequence), recipe
    tiny = entrypoint.load_recipe(REPO / levers.TINY).configure()
    assert tiny.train.global_batch_size == levers.TINY_GLOBAL_BATCH


def test_graph_arms_warm_up_past_the_capture():
    capture_after = next(
        f.default for f in dataclasses.fields(TransformerConfig) if f.name == "cuda_graph_warmup_steps"
    )
    for name in ("graphs_te", "graphs_full"):
        assert levers.CHANGES[name].warmup_steps >= capture_after + 2  # the capture step, then one replayed


def test_upstream_arms_alive_together_get_ports_of_their_own():
    for arms in PLAN_ARMS.values():
        ports = [c for arm in arms.values() for c in arm.command if c.startswith("--master-port=")]
        assert len(ports) == len(set(ports))


def distinct_configs() -> dict[str, tuple[str, tuple[str, ...], int]]:
    """One arm per distinct recipe, overrides and world size (arms that change only the environment share one)."""
    found: dict[tuple, str] = {}
    for (plan, gpus), arms in PLAN_ARMS.items():
        if gpus == 1 or plan == "llama8b-2gpu":
            for arm in arms.values():
                found.setdefault((arm.recipe, arm.overrides, gpus), f"{plan}/{arm.name}/{gpus}")
    return {label: key for key, label in found.items()}


CONFIGS = distinct_configs()


@pytest.mark.parametrize("label", CONFIGS)
def test_every_arm_config_passes_megatron_bridges_checks_with_no_override_undone(label: str, output_root):
    recipe, overrides, gpus = CONFIGS[label]
    checked = arm_check.check_arm(str(REPO / recipe), list(overrides), gpus)
    assert checked["ok"], checked.get("error")
    assert checked["inert"] == {}


def test_an_override_megatron_bridge_undoes_is_reported(output_root):
    checked = arm_check.check_arm(str(REPO / levers.TINY), ["ddp.grad_reduce_in_fp32=false"], 1)
    assert checked["inert"] == {"ddp.grad_reduce_in_fp32": {"given": False, "holds": True}}
    refused = arm_check.check_arm(str(REPO / levers.TINY), ["model.cuda_graph_impl=local"], 1)
    assert not refused["ok"] and "cuda_graph_impl" in refused["error"]


def test_megatron_bridges_flop_formula_is_the_one_of_its_published_llama3_8b_row(output_root):
    """Megatron Bridge's H100 table (25.11): Llama 3 8B FP8-CS, 744 TFLOP/s/GPU at 14,451 tokens/s/GPU."""
    flops = arm_check.check_arm(str(REPO / levers.LLAMA_FP8), [], 1)["gflop_per_token"]
    assert flops["megatron_bridge"] == pytest.approx(744e3 / 14451, abs=0.05)
    assert flops["6N"] == pytest.approx(6 * 8.0305, abs=0.01)
    assert flops["6N + attention"] / flops["6N"] == pytest.approx(1.134, abs=0.002)
