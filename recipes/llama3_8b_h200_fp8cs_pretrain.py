"""Llama 3 8B on H200 GPUs in FP8 with current scaling and TE's operation fuser: the fastest (docs/checks.md)."""

from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.mixed_precision import bf16_with_fp8_current_scaling_mixed

from recipes import llama3_8b_h200_pretrain, llama3_8b_pretrain
from recipes.shared import DataPaths


def configure(
    hf_path: str = str(llama3_8b_pretrain.ARCHITECTURE),
    use_megatron_fsdp: bool = True,
    data_paths: DataPaths = None,
    tokenizer_path: str | None = None,
) -> ConfigContainer:
    cfg = llama3_8b_h200_pretrain.configure(
        hf_path=hf_path, use_megatron_fsdp=use_megatron_fsdp, data_paths=data_paths, tokenizer_path=tokenizer_path
    )
    cfg.mixed_precision = bf16_with_fp8_current_scaling_mixed()
    cfg.mixed_precision.first_last_layers_bf16 = False
    # The same weights and parameter names as the unfused MLP: Hugging Face weights and checkpoints still map.
    cfg.model.use_transformer_engine_op_fuser = True
    return cfg
