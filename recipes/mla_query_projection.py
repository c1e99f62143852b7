"""DeepSeek's multi-latent attention without query compression, as Hugging Face defines it (docs/checks.md)."""

from dataclasses import replace

from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
from megatron.core.transformer.multi_latent_attention import MLASelfAttention
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from megatron.core.transformer.transformer_config import TransformerConfig


class MLASelfAttentionWithPlainQueryProjection(MLASelfAttention):
    """MLASelfAttention whose uncompressed query projection is the spec's linear layer, with no norm fused in."""

    def _resolve_qk_norm_config(self, submodules) -> dict:
        classes = super()._resolve_qk_norm_config(submodules)
        if self.config.q_lora_rank is None:
            classes["linear_q_proj"] = submodules.linear_q_proj
        return classes


def with_plain_query_projection(layer: ModuleSpec) -> ModuleSpec:
    attention = layer.submodules.self_attention
    if attention.module is not MLASelfAttention:
        return layer
    attention = replace(attention, module=MLASelfAttentionWithPlainQueryProjection)
    return replace(layer, submodules=replace(layer.submodules, self_attention=attention))


def decoder_block_spec(
    config: TransformerConfig, vp_stage: int | None = None, pp_rank: int | None = None
) -> TransformerBlockSubmodules:
    """The Transformer Engine decoder block DeepSeek's bridge builds, with the query projection as in Hugging Face."""
    block = get_gpt_decoder_block_spec(config, use_transformer_engine=True, vp_stage=vp_stage, pp_rank=pp_rank)
    return replace(block, layer_specs=[with_plain_query_projection(layer) for layer in block.layer_specs])
