"""The cases of the per-step A/B (bench/bench_turns.py): what each arm changes in the shipped recipe, and the plans
that say which arms take turns together.

Lever arms are our launch (srun.sh --local) of the shipped FP8 recipe with one change; "upstream" is the same recipe
and overrides launched the upstream way (torchrun bench/upstream_pretrain.py); "seed" repeats the shipped recipe with
another seed, which gives the run-to-run noise of step time and of the loss curve.
"""

from dataclasses import dataclass

from bench import launches, turns

TINY = "recipes/tiny_gpt_pretrain.py"
LLAMA_FP8 = "recipes/llama3_8b_h200_fp8cs_pretrain.py"
LLAMA_BF16 = "recipes/llama3_8b_h200_pretrain.py"
SEQUENCE = {TINY: 2048, LLAMA_FP8: 8192, LLAMA_BF16: 8192}  # the recipes' model.seq_length
TINY_GLOBAL_BATCH = 32  # the tiny recipe's train.global_batch_size

# An arm is stopped in the middle of its run: on SIGTERM Megatron Bridge ends the step, flushes TensorBoard and exits
# (its data loader workers need the handler too, or their death fails the rank first); with no checkpoint to write.
STOPPABLE = ("train.exit_signal_handler=true", "train.exit_signal_handler_for_dataloader=true", "checkpoint.save=null")

# Megatron's NaN checks, which upstream's performance recipes turn off. What a user gives up: a NaN or Inf gradient
# stops the run at the step it appears in (ddp.check_for_nan_in_grad), naming the rank; a NaN loss is caught in the
# micro-batch that produced it, where the rerun state machine can tell a transient fault from a persistent one
# (check_for_nan_in_loss). Without them a NaN reaches the optimizer, corrupts the weights, and shows up later in the
# logged loss. grad_reduce_in_fp32 is set through mixed_precision: Megatron Bridge copies the precision preset's
# value over ddp.grad_reduce_in_fp32 (an override of ddp's is undone); under Megatron FSDP (megatron-core 0.19.2) the
# gradient buffer's dtype is ddp.megatron_fsdp_main_grads_dtype instead (unset: BF16), so the FSDP recipes already
# accumulate and reduce gradients in BF16 and this one is inert there.
NO_CHECKS = (
    "ddp.check_for_nan_in_grad=false",
    "rerun_state_machine.check_for_nan_in_loss=false",
    "mixed_precision.grad_reduce_in_fp32=false",
)
# Transformer Engine's CUDA graphs need its RNG tracker (Megatron Bridge syncs rng.te_rng_tracker with the model's);
# the Llama recipe sets the deprecated cuda_graph_scope ("full"), which megatron-core 0.19 refuses beside
# cuda_graph_modules. Capture happens after cuda_graph_warmup_steps (3) steps, so these arms warm up longer.
GRAPHS = ("model.cuda_graph_scope=null", "model.use_te_rng_tracker=true")
TE_GRAPHS = (*GRAPHS, "model.cuda_graph_impl=transformer_engine", "model.cuda_graph_modules=[attn,mlp]")


@dataclass(frozen=True)
class Change:
    """What an arm changes in the shipped recipe."""

    overrides: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    recipe: str | None = None  # another recipe than the plan's
    launcher: str = "ours"  # or "upstream"
    sequences_per_gpu: int | None = None  # per step; None: the plan's
    warmup_steps: int = 2
    noise_of: str | None = None
    note: str = ""


CHANGES = {
    "ours": Change(note="the shipped recipe, launched by `srun.sh --local`"),
    "upstream": Change(launcher="upstream", note="the same, launched by `torchrun bench/upstream_pretrain.py`"),
    "seed": Change(("rng.seed=4321",), noise_of="ours", note="the shipped recipe with another seed: run-to-run noise"),
    "no_checks": Change(NO_CHECKS, note="NaN checks off, gradients reduced in BF16 (inert under Megatron FSDP)"),
    # Per-layer graphs of attention and MLP. Megatron FSDP's hooks are captured at the wrong phase with them in
    # megatron-core 0.19.2 (the fix, Megatron-LM PR 4232 with Transformer Engine PR 2831, is not in it): expect a
    # failure or a loss that parts from the reference.
    "graphs_te": Change(
        TE_GRAPHS, warmup_steps=6, note="TE CUDA graphs of attention and MLP (cuda_graph_impl=transformer_engine)"
    ),
    # One graph of the whole forward-backward, which Megatron FSDP supports in its CUDA-graph mode (graph-safe
    # gradients, no all-gather at the start of the parameter sync); Megatron Bridge requires the loss check off with
    # it, and the gradient check's host sync cannot be captured: compare with no_checks.
    "graphs_full": Change(
        (
            *NO_CHECKS,
            *GRAPHS,
            "model.cuda_graph_impl=full_iteration",
            "model.cuda_graph_modules=[]",
            "ddp.megatron_fsdp_cuda_graph_mode=true",
            "ddp.fsdp_all_gather_in_start_param_sync=false",
        ),
        warmup_steps=6,
        note="a full-iteration CUDA graph with Megatron FSDP's CUDA-graph mode, NaN checks off",
    ),
    "gbs16": Change(sequences_per_gpu=16, note="16 sequences per GPU per step, as upstream's rows (same micro-batch)"),
    "cudnn_norms": Change(
        env=(("NVTE_NORM_FWD_USE_CUDNN", "1"), ("NVTE_NORM_BWD_USE_CUDNN", "1")), note="cuDNN's RMSNorm kernels"
    ),
    "expandable_segments": Change(
        env=(("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),), note="PyTorch's expandable allocator segments"
    ),
    # NCCL work only: on one GPU there is none to change.
    "nccl_env": Change(
        env=(("NCCL_CTA_POLICY", "1"), ("TORCH_NCCL_HIGH_PRIORITY", "1")),
        note="NCCL's efficiency CTA policy and high-priority NCCL streams (2 GPUs or more)",
    ),
    "bf16": Change(recipe=LLAMA_BF16, note="the BF16 recipe, llama3_8b_h200_pretrain.py"),
    # A report every 30 s, so that the counted steps include the report's gather (the default is every 300 s).
    "straggler": Change(
        ("nvrx_straggler.enabled=true", "nvrx_straggler.report_time_interval=30"),
        note="NVRx straggler detection (its CUDA-event timing of every step, a report every 30 s)",
    ),
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


# One H200: two 4-layer processes of the Llama 3 8B shape (FP8, micro-batch 2, sequence 8192) hold about 45-50 GB
# each (Megatron Bridge's estimate of 18 bytes a parameter for 1.9 G parameters, plus activations at the 62% of its
# estimate measured at 32 layers on 2 GPUs), so a lever arm and the reference fit side by side with room for a CUDA
# graph pool; at 6 layers the pair would leave under 20 GB. A single process fits up to about 16 layers (110 GB):
# "llama8b-solo" measures the shipped recipe there alone, for the absolute figures.
# The lever plans' shape: two 4-layer arms side by side on one H200 (above), 6 rounds of 3 counted steps.
BESIDE_A_REFERENCE = {"layers": 4, "sequences_per_gpu": 8, "rounds": 6, "turn_steps": 3}
PLANS = {
    "tiny": Plan(
        TINY, (("ours", "upstream", "seed"),), None, None, rounds=10, turn_steps=8, note="ours against upstream"
    ),
    "llama8b-ab": Plan(
        LLAMA_FP8,
        (("ours", "upstream"), ("ours", "seed"), ("ours", "no_checks"), ("no_checks", "graphs_full")),
        **BESIDE_A_REFERENCE,
        note="ours against upstream, the run-to-run noise, NaN checks, full-iteration graphs",
    ),
    "llama8b-levers": Plan(
        LLAMA_FP8,
        (
            ("ours", "gbs16"),
            ("ours", "bf16"),
            ("ours", "expandable_segments"),
            ("ours", "cudnn_norms"),
            ("ours", "graphs_te"),
        ),
        **BESIDE_A_REFERENCE,
        note="more micro-batches per step, BF16, the allocator, cuDNN norms, TE graphs",
    ),
    "llama8b-straggler": Plan(
        LLAMA_FP8, (("ours", "straggler"),), **BESIDE_A_REFERENCE, note="the step time with straggler detection on"
    ),
    "llama8b-solo": Plan(
        LLAMA_FP8, (("ours",),), layers=16, sequences_per_gpu=8, rounds=1, turn_steps=8, note="16 layers, alone"
    ),
    "llama8b-2gpu": Plan(
        LLAMA_FP8,
        (("ours", "nccl_env"), ("ours", "no_checks")),
        layers=8,
        sequences_per_gpu=8,
        rounds=6,
        turn_steps=3,
        note="the NCCL levers, which need communication (run with --gpus 2)",
    ),
}


def merged(*groups: tuple[str, ...]) -> tuple[str, ...]:
    """NAME=VALUE from all groups, one per NAME (a later group's wins, in the place of the first): the launches refuse
    a key given twice."""
    by_key: dict[str, str] = {}
    for group in groups:
        for override in group:
            by_key[override.split("=", 1)[0]] = override
    return tuple(by_key.values())


def train_iters(plan: Plan, settle: int, warmup: int) -> int:
    """Enough steps for the arm that stays longest, and the same for every arm, so that all share one LR schedule."""
    per_block = plan.rounds * (1 + settle + plan.turn_steps)
    return 2 * (warmup + per_block * len(plan.blocks)) + 50


def arm_overrides(plan: Plan, name: str, gpus: int, iterations: int) -> tuple[str, ...]:
    change = CHANGES[name]
    sequences = change.sequences_per_gpu or plan.sequences_per_gpu
    shape = (f"model.num_layers={plan.layers}",) if plan.layers else ()
    batch = (f"train.global_batch_size={sequences * gpus}",) if sequences else ()
    steps = (f"train.train_iters={iterations}",)
    return merged(launches.MEASURED, STOPPABLE, steps, shape, batch, change.overrides)


def tokens_per_step(plan: Plan, name: str, gpus: int) -> int:
    change = CHANGES[name]
    sequences = change.sequences_per_gpu or plan.sequences_per_gpu
    global_batch = sequences * gpus if sequences else TINY_GLOBAL_BATCH
    return global_batch * SEQUENCE[change.recipe or plan.recipe]


def arms(plan: Plan, gpus: int, settle: int) -> dict[str, turns.Arm]:
    names = list(dict.fromkeys(name for block in plan.blocks for name in block))
    warmup = max(CHANGES[name].warmup_steps for name in names)
    iterations = train_iters(plan, settle, warmup)
    built = {}
    for index, name in enumerate(names):
        change = CHANGES[name]
        recipe = change.recipe or plan.recipe
        overrides = arm_overrides(plan, name, gpus, iterations)
        if change.launcher == "upstream":
            command = launches.upstream(recipe, *overrides, gpus=gpus, port=29500 + index)
        else:
            command = launches.ours(recipe, *overrides)
        built[name] = turns.Arm(
            name=name,
            command=tuple(command),
            env={"SRUNSH_GPUS_PER_NODE": str(gpus), **dict(change.env)},
            tokens_per_step=tokens_per_step(plan, name, gpus),
            gpus=gpus,
            warmup_steps=change.warmup_steps,
            noise_of=change.noise_of,
            note=change.note,
            recipe=recipe,
            overrides=overrides,
        )
    return built


def blocks(plan: Plan, rounds: int | None = None) -> list[turns.Block]:
    return [turns.Block(arms=block, rounds=rounds or plan.rounds) for block in plan.blocks]
