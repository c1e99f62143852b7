"""DeepSeek-V2 (236B MoE, 21B active) on 4 nodes of 8 H200s; mock data without data_paths= (docs/checks.md)."""

import torch
from megatron.bridge.recipes.deepseek.deepseek_v2 import deepseek_v2_pretrain_config
from megatron.bridge.training.config import ConfigContainer

from recipes import mla_query_projection
from recipes.shared import DataPaths, apply_switches, from_hf

HUB_ID = "deepseek-ai/DeepSeek-V2"


def configure(
    hf_path: str | None = None,
    moe_token_dispatcher_type: str | None = None,
    use_megatron_fsdp: bool = False,
    data_paths: DataPaths = None,
    tokenizer_path: str | None = None,
) -> ConfigContainer:
    cfg = from_hf(deepseek_v2_pretrain_config, HUB_ID, hf_path)

    # Parallelism for 32 GPUs: 60 layers in 4 pipeline stages (one per node), the 160 routed experts over 8 ranks.
    cfg.model.tensor_model_parallel_size = 1
    cfg.model.pipeline_model_parallel_size = 4
    cfg.model.pipeline_dtype = torch.bfloat16
    cfg.model.expert_model_parallel_size = 8

    # Model: the query projection as Hugging Face builds it (no fused Q norm; matters when q_lora_rank is None).
    cfg.model.transformer_layer_spec = mla_query_projection.decoder_block_spec

    # Memory: bf16 optimizer moments halve the optimizer state of the expert weights each rank holds alone.
    cfg.optimizer.use_precision_aware_optimizer = True
    cfg.optimizer.exp_avg_dtype = torch.bfloat16
    cfg.optimizer.exp_avg_sq_dtype = torch.bfloat16

    # Training
    cfg.model.seq_length = 4096
    cfg.dataset.seq_length = 4096
    cfg.train.train_iters = 500
    cfg.train.global_batch_size = 256
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
