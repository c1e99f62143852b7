"""The plans of the per-step A/B (bench/bench_turns.py): which launches of a recipe take turns together.

"ours" is our launch (srun.sh --local) of the plan's recipe; "upstream" is the same recipe and overrides launched the
upstream way (torchrun bench/upstream_pretrain.py); "seed" repeats ours with another seed, which gives the run-to-run
noise of step time and of the loss curve.
"""

from dataclasses import dataclass

from bench import launches, turns

TINY = "recipes/tiny_gpt_pretrain.py"
LLAMA_FP8 = "recipes/llama3_8b_h200_fp8cs_pretrain.py"
SEQUENCE = {TINY: 2048, LLAMA_FP8: 8192}  # the recipes' model.seq_length
TINY_GLOBAL_BATCH = 32  # the tiny recipe's train.global_batch_size
WARMUP_STEPS = 2  # logged steps before an arm's first turn

# An arm is stopped in the middle of its run: on SIGTERM Megatron Bridge ends the step, flushes TensorBoard and exits
# (its data loader workers need the handler too, or their death fails the rank first); with no checkpoint to write.
STOPPABLE = ("train.exit_signal_handler=true", "train.exit_signal_handler_for_dataloader=true", "checkpoint.save=null")


NOTES = {
    "ours": "the shipped recipe, launched by `srun.sh --local`",
    "upstream": "the same, launched by `torchrun bench/upstream_pretrain.py`",
    "seed": "the shipped recipe with another seed: run-to-run noise",
    "straggler": "the shipped recipe with NVRx straggler detection on (CUDA-event timing of every step)",
}
# Each arm's one change from "ours"; the straggler arm reports every 30 s (not 300), so counted steps include one.
CHANGES = {
    "seed": ("rng.seed=4321",),
    "straggler": ("nvrx_straggler.enabled=true", "nvrx_straggler.report_time_interval=30"),
}


@dataclass(frozen=True)
class Plan:
    recipe: str
    blocks: tuple[tuple[str, ...], ...]  # each block's first arm is the reference of the others
    layers: int | None  # model.num_layers; None: the recipe's
    sequences_per_gpu: int | None  # per step; None: the recipe's global batch
    rounds: int
    turn_steps: int
    note: str


# One H200 holds two 4-layer processes of the Llama 3 8B shape (FP8, micro-batch 2, sequence 8192) side by side,
# about 45-50 GB each (--layers changes it).
PLANS = {
    "tiny": Plan(
        TINY, (("ours", "upstream", "seed"),), None, None, rounds=10, turn_steps=8, note="ours against upstream"
    ),
    "llama8b-ab": Plan(
        LLAMA_FP8,
        (("ours", "upstream"), ("ours", "seed")),
        layers=4,
        sequences_per_gpu=8,
        rounds=6,
        turn_steps=3,
        note="ours against upstream, and the run-to-run noise",
    ),
    "llama8b-straggler": Plan(LLAMA_FP8, (("ours", "straggler"),), 4, 8, 6, 3, "straggler detection's cost"),
}


def train_iters(plan: Plan, settle: int) -> int:
    """Enough steps for the arm that stays longest, and the same for every arm, so that all share one LR schedule."""
    per_block = plan.rounds * (1 + settle + plan.turn_steps)
    return 2 * (WARMUP_STEPS + per_block * len(plan.blocks)) + 50


def arm_overrides(plan: Plan, name: str, gpus: int, iterations: int) -> tuple[str, ...]:
    shape = (f"model.num_layers={plan.layers}",) if plan.layers else ()
    batch = (f"train.global_batch_size={plan.sequences_per_gpu * gpus}",) if plan.sequences_per_gpu else ()
    change = CHANGES.get(name, ())
    return (*launches.MEASURED, *STOPPABLE, f"train.train_iters={iterations}", *shape, *batch, *change)


def tokens_per_step(plan: Plan, gpus: int) -> int:
    global_batch = plan.sequences_per_gpu * gpus if plan.sequences_per_gpu else TINY_GLOBAL_BATCH
    return global_batch * SEQUENCE[plan.recipe]


def arms(plan: Plan, gpus: int, settle: int) -> dict[str, turns.Arm]:
    names = list(dict.fromkeys(name for block in plan.blocks for name in block))
    iterations = train_iters(plan, settle)
    built = {}
    for index, name in enumerate(names):
        overrides = arm_overrides(plan, name, gpus, iterations)
        if name == "upstream":
            command = launches.upstream(plan.recipe, *overrides, gpus=gpus, port=29500 + index)
        else:
            command = launches.ours(plan.recipe, *overrides)
        built[name] = turns.Arm(
            name=name,
            command=tuple(command),
            env={"SRUNSH_GPUS_PER_NODE": str(gpus)},
            tokens_per_step=tokens_per_step(plan, gpus),
            gpus=gpus,
            warmup_steps=WARMUP_STEPS,
            noise_of="ours" if name == "seed" else None,
            note=NOTES[name],
            recipe=plan.recipe,
            overrides=overrides,
        )
    return built


def blocks(plan: Plan, rounds: int | None = None) -> list[turns.Block]:
    return [turns.Block(arms=block, rounds=rounds or plan.rounds) for block in plan.blocks]
