"""Tiny Hugging Face model folders in the shapes our recipes read, written by the tests (no hub, no download).

`python3 tests/hf_models.py deepseek_v2 DIR [--weights]` writes one from the command line (the GPU suite uses it).
"""

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DeepseekV2Config, LlamaConfig, PretrainedConfig, Qwen3MoeConfig


def deepseek_v2(layers: int = 4) -> PretrainedConfig:
    """DeepSeek-V2-Lite's structure at small size: MLA, MoE with shared experts, first layer dense."""
    return DeepseekV2Config(
        architectures=["DeepseekV2ForCausalLM"],
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1408,
        moe_intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=8,
        kv_lora_rank=128,
        q_lora_rank=None,
        qk_nope_head_dim=64,
        qk_rope_head_dim=32,
        v_head_dim=64,
        n_routed_experts=16,
        n_shared_experts=2,
        num_experts_per_tok=4,
        first_k_dense_replace=1,
        topk_method="greedy",
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )


def qwen3_moe(layers: int = 4) -> PretrainedConfig:
    return Qwen3MoeConfig(
        architectures=["Qwen3MoeForCausalLM"],
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1024,
        moe_intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        num_experts=16,
        num_experts_per_tok=4,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )


def llama(layers: int = 2) -> PretrainedConfig:
    return LlamaConfig(
        architectures=["LlamaForCausalLM"],
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    )


SHAPES = {"deepseek_v2": deepseek_v2, "qwen3_moe": qwen3_moe, "llama": llama}
# The shape that stands in for each shipped recipe's hub model (hf_path=...) in the tests and benchmarks; None: the
# recipe reads no hub model (its architecture ships in recipes/hf_configs, or it has none).
RECIPE_SHAPES = {
    "deepseek_v2_lite_pretrain": "deepseek_v2",
    "deepseek_v2_pretrain": "deepseek_v2",
    "qwen3_30b_a3b_pretrain": "qwen3_moe",
    "llama3_8b_pretrain": None,
    "llama3_8b_h200_pretrain": None,
    "llama3_8b_h200_fp8cs_pretrain": None,
    "tiny_gpt_pretrain": None,
}


# The one logit the constant-prediction weights raise above the others (all 0).
CONSTANT_LOGIT = 10.0


def constant_prediction(model: torch.nn.Module) -> None:
    """Weights whose every next-token distribution is the same: logit CONSTANT_LOGIT for token 0, 0 elsewhere.

    Every layer's weights are zero, so each layer adds nothing to the residual stream; every embedding is a vector of
    ones, which the final RMSNorm keeps; only row 0 of the output layer is non-zero. The loss is then
    log(V - 1 + e^CONSTANT_LOGIT) for every target token, whatever the tokens are, and far from a random model's
    log(V): a first-iteration loss equal to it proves the weights were loaded.
    """
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("embed_tokens.weight"):
                parameter.fill_(1.0)
            elif name == "model.norm.weight":
                parameter.fill_(1.0)
            elif name == "lm_head.weight":
                parameter.zero_()
                parameter[0].fill_(CONSTANT_LOGIT / parameter.shape[1])
            else:
                parameter.zero_()


def write(shape: str, directory: Path, weights: str | None = None, layers: int | None = None, seed: int = 0) -> Path:
    """Write config.json and, with weights='random' or 'constant', bf16 safetensors of that model into directory."""
    config = SHAPES[shape]() if layers is None else SHAPES[shape](layers)
    directory.mkdir(parents=True, exist_ok=True)
    if weights is None:
        config.save_pretrained(directory)
        return directory
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    if weights == "constant":
        constant_prediction(model)
    model.save_pretrained(directory)
    return directory


def hf_loss(directory: Path, tokens: torch.Tensor) -> float:
    """The Hugging Face model's own next-token loss on tokens (shape [batch, seq])."""
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    with torch.no_grad():
        return float(model(input_ids=tokens, labels=tokens).loss)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("directory", type=Path)
    parser.add_argument("--weights", choices=["random", "constant"])
    parser.add_argument("--layers", type=int)
    args = parser.parse_args()
    print(write(args.shape, args.directory, args.weights, args.layers))
