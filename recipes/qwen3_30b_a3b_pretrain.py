"""Qwen3-30B-A3B (MoE, 3B active) pretraining on 2 nodes of 8 GPUs; mock data without data_paths= (docs/checks.md)."""

from megatron.bridge.recipes.qwen.h100.qwen3_moe import qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config
from megatron.bridge.training.config import ConfigContainer

from recipes.shared import DataPaths, apply_switches, from_hf

HUB_ID = "Qwen/Qwen3-30B-A3B"


def configure(
    hf_path: str | None = None,
    moe_token_dispatcher_type: str | None = None,
    use_megatron_fsdp: bool = False,
    data_paths: DataPaths = None,
    tokenizer_path: str | None = None,
) -> ConfigContainer:
    cfg = from_hf(qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config, HUB_ID, hf_path)

    # Parallelism (upstream's 8-GPU layout): TP=4 with sequence parallel, PP=2, EP=4 over the 128 experts.
    cfg.model.tensor_model_parallel_size = 4
    cfg.model.pipeline_model_parallel_size = 2
    cfg.model.expert_model_parallel_size = 4
    cfg.model.sequence_parallel = True

    # Training
    cfg.model.seq_length = 4096
    cfg.dataset.seq_length = 4096
    cfg.train.train_iters = 500
    cfg.train.global_batch_size = 128
    cfg.train.micro_batch_size = 1
    cfg.validation.eval_interval = 100
    cfg.scheduler.lr_warmup_iters = 50

    return apply_switches(
        cfg,
        hf_path=hf_path,
        moe_token_dispatcher_type=moe_token_dispatcher_type,
        use_megatron_fsdp=use_megatron_fsdp,
        data_paths=data_paths,
        tokenizer_path=tokenizer_path,
    )
