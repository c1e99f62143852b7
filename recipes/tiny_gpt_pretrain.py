"""A small GPT that trains offline on 1-2 GPUs in about a minute: the first run on a new machine (docs/checks.md)."""

from megatron.bridge.recipes.gpt.vanilla_gpt import vanilla_gpt_pretrain_config
from megatron.bridge.training.config import ConfigContainer

from recipes.shared import DataPaths, apply_switches


def configure(
    use_megatron_fsdp: bool = False, data_paths: DataPaths = None, tokenizer_path: str | None = None
) -> ConfigContainer:
    cfg = vanilla_gpt_pretrain_config()

    # Model: 4 layers of Llama-style blocks, Transformer Engine layers.
    cfg.model.num_layers = 4
    cfg.model.hidden_size = 1024
    cfg.model.ffn_hidden_size = 4096
    cfg.model.num_attention_heads = 16
    cfg.model.normalization = "RMSNorm"
    cfg.model.gated_linear_unit = True
    cfg.model.activation_func = "silu"
    cfg.model.position_embedding_type = "rope"
    cfg.model.seq_length = 2048
    cfg.model.transformer_impl = "transformer_engine"

    # Training: 100 short steps (mock data unless data_paths is given).
    cfg.dataset.seq_length = 2048
    cfg.train.train_iters = 100
    cfg.train.global_batch_size = 32
    cfg.train.micro_batch_size = 4
    cfg.scheduler.lr_warmup_iters = 10
    cfg.validation.eval_interval = 50
    cfg.validation.eval_iters = 2
    cfg.logger.log_interval = 1

    return apply_switches(
        cfg, use_megatron_fsdp=use_megatron_fsdp, data_paths=data_paths, tokenizer_path=tokenizer_path
    )
