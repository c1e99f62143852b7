"""Llama 3 8B pretraining as in llama3_8b_h200_pretrain.py, in FP8 with current (per-tensor) scaling on every layer,
with Transformer Engine's operation fuser in the MLP: the fastest measured (bench/results/launch-ab.md).

Megatron Bridge's `bf16_with_fp8_current_scaling_mixed` preset keeps the first and the last transformer layer in BF16
for numerical headroom; Megatron Bridge's performance scripts, which produce its published throughput, run every layer
in FP8, and so does this recipe (2.1% more tokens/s on 2 x H200). The operation fuser runs the MLP as one sequence of
TE operations and fuses neighbouring ones (3.0 to 3.8% more, the same losses). For the preset as it is, use
llama3_8b_h200_pretrain.py with mixed_precision=bf16_with_fp8_current_scaling_mixed.

    salloc -N 2 ./srun.sh recipes/llama3_8b_h200_fp8cs_pretrain.py
"""

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
