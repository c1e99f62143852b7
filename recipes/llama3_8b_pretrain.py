"""Llama 3 8B pretraining with Megatron FSDP, no hub access; mock data unless data_paths= is given (docs/checks.md)."""

from pathlib import Path

from megatron.bridge.recipes.llama.llama3 import llama3_8b_pretrain_config
from megatron.bridge.training.config import ConfigContainer

from recipes.shared import DataPaths, apply_switches, from_hf

HUB_ID = "meta-llama/Meta-Llama-3-8B"
ARCHITECTURE = Path(__file__).parent / "hf_configs" / "llama3_8b"


def configure(
    hf_path: str = str(ARCHITECTURE),
    use_megatron_fsdp: bool = True,
    data_paths: DataPaths = None,
    tokenizer_path: str | None = None,
) -> ConfigContainer:
    cfg = from_hf(llama3_8b_pretrain_config, HUB_ID, hf_path)

    # Parallelism: FSDP shards parameters, gradients and optimizer state over all ranks; no TP/PP/CP needed at 8B.
    cfg.model.tensor_model_parallel_size = 1
    cfg.model.pipeline_model_parallel_size = 1
    cfg.model.context_parallel_size = 1

    # Training
    cfg.model.seq_length = 8192
    cfg.dataset.seq_length = 8192
    cfg.train.train_iters = 1000
    cfg.train.global_batch_size = 128
    cfg.train.micro_batch_size = 1
    cfg.validation.eval_interval = 500
    cfg.validation.eval_iters = 4
    cfg.scheduler.lr_warmup_iters = 100

    return apply_switches(
        cfg, hf_path=hf_path, use_megatron_fsdp=use_megatron_fsdp, data_paths=data_paths, tokenizer_path=tokenizer_path
    )
