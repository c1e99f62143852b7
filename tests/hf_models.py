"""Tiny Hugging Face model folders in the shapes our recipes read, written by the tests (no hub, no download), and
a tokenizer trained here on text made here, for the tests that prepare data.

`python3 tests/hf_models.py deepseek_v2 DIR [--weights]` writes one from the command line (the GPU suite uses it).
"""

import argparse
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    DeepseekV2Config,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen3MoeConfig,
)


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


# Words of the made-up documents; sentences follow one pattern, so a model's loss on them falls within a few steps.
SUBJECTS = ("the cat", "a dog", "my friend", "the old man", "our teacher", "the small bird", "a farmer", "the child")
VERBS = ("sees", "likes", "finds", "carries", "paints", "follows", "remembers", "builds")
OBJECTS = ("a red house", "the river", "two apples", "the green hill", "a long letter", "the winter sky", "bread")
PLACES = ("in the morning", "near the sea", "after dinner", "on the road", "at school", "in the garden")


def sample_texts(count: int, seed: int = 0) -> list[str]:
    """count short English-like documents, the same for the same seed."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        sentences = [
            f"{rng.choice(SUBJECTS).capitalize()} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(PLACES)}."
            for _ in range(rng.randint(2, 6))
        ]
        texts.append(" ".join(sentences))
    return texts


BOS, EOS = "<s>", "</s>"


def write_tokenizer(directory: Path, texts: list[str], vocab_size: int = 400) -> Path:
    """A byte-level BPE tokenizer trained on texts with the tokenizers library, saved as a Hugging Face tokenizer
    folder (tokenizer.json, tokenizer_config.json) as a model's hf_path holds one: every encoding starts with <s>
    (special tokens are kept, as Megatron's tokenizer keeps them), </s> is its end-of-document token."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[BOS, EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, tokenizer.token_to_id(BOS))]
    )
    directory.mkdir(parents=True, exist_ok=True)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS).save_pretrained(directory)
    return directory


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("directory", type=Path)
    parser.add_argument("--weights", choices=["random", "constant"])
    parser.add_argument("--layers", type=int)
    args = parser.parse_args()
    print(write(args.shape, args.directory, args.weights, args.layers))
