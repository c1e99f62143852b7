"""Llama 3 8B pretraining as in llama3_8b_pretrain.py, for H200 GPUs: micro-batch 2 instead of 1 (docs/checks.md)."""

from megatron.bridge.training.config import ConfigContainer

from recipes import llama3_8b_pretrain
from recipes.shared import DataPaths


def configure(
    hf_path: str = str(llama3_8b_pretrain.ARCHITECTURE),
    use_megatron_fsdp: bool = True,
    data_paths: DataPaths = None,
    tokenizer_path: str | None = None,
) -> ConfigContainer:
    cfg = llama3_8b_pretrain.configure(
        hf_path=hf_path, use_megatron_fsdp=use_megatron_fsdp, data_paths=data_paths, tokenizer_path=tokenizer_path
    )
    # Half as many micro-batches a step: Megatron FSDP gathers and reduce-scatters once per micro-batch.
    cfg.train.micro_batch_size = 2
    return cfg
