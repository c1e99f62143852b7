"""The shipped recipes and the shared switches, against the real megatron-bridge config classes, offline."""

import dataclasses
import inspect
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from megatron.bridge import AutoBridge
from megatron.bridge.models.gpt_provider import default_layer_spec
from megatron.bridge.training.mixed_precision import get_mixed_precision_config
from megatron.core.extensions.transformer_engine import (
    TEColumnParallelLinear,
    TEFusedMLP,
    TELayerNormColumnParallelLinear,
)
from megatron.core.transformer.mla_qk_norm_config import QKNormConfigResolver
from megatron.core.transformer.mlp import MLP
from megatron.core.transformer.multi_latent_attention import MLASelfAttention

import entrypoint
from launcher.errors import UsageError
from recipes import mla_query_projection, shared
from tests import hf_models
from tests.conftest import RECIPES, REPO

SHAPES = hf_models.RECIPE_SHAPES


def resolve(recipe: str, *argv: str):
    cfg, _ = entrypoint.resolve(entrypoint.parse_args([str(REPO / "recipes" / recipe), *argv]))
    return cfg


def test_every_shipped_recipe_has_a_shape_here():
    assert sorted(p.stem for p in RECIPES) == sorted(SHAPES)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_shipped_recipe_resolves_with_print_config(recipe: Path, entrypoint_main, hf_dir):
    shape = SHAPES[recipe.stem]
    arguments = [f"hf_path={hf_dir(shape)}"] if shape else []
    result = entrypoint_main(str(recipe), *arguments, "--print-config")
    assert result.returncode == 0, result.stderr[-3000:]
    config = yaml.safe_load(result.stdout)
    assert config["train"]["train_iters"] > 0
    assert config["profiling"]["use_viztracer"] is False


def test_deepseek_v2_lite_keeps_the_seed_settings(output_root: Path, hf_dir: Callable[[str], Path]):
    cfg = resolve("deepseek_v2_lite_pretrain.py", f"hf_path={hf_dir('deepseek_v2')}")
    model = cfg.model
    assert (model.tensor_model_parallel_size, model.pipeline_model_parallel_size) == (8, 1)
    assert model.expert_model_parallel_size == 2
    assert model.sequence_parallel is True
    assert model.seq_length == cfg.dataset.seq_length == 4096
    assert (cfg.train.train_iters, cfg.train.global_batch_size, cfg.train.micro_batch_size) == (500, 64, 1)
    assert cfg.validation.eval_interval == 100
    assert cfg.scheduler.lr_warmup_iters == 50
    assert cfg.checkpoint.save_interval > 0  # upstream's: the seed's demo value 0 kept nothing (issue 67)
    assert model.moe_permute_fusion is False
    assert model.num_layers == 4  # from the local config.json, not the hub's 27


def test_deepseek_v2_lite_fits_one_8_gpu_node(output_root: Path, hf_dir: Callable[[str], Path]):
    """As shipped (the seed's TP8 EP2): Megatron Bridge takes expert TP 1 with EP 2, so one 8-GPU node is enough;
    expert TP 8 would need 16 ranks."""
    hf_path = f"hf_path={hf_dir('deepseek_v2')}"
    resolve("deepseek_v2_lite_pretrain.py", hf_path, "--world-size", "8")
    with pytest.raises(UsageError, match="8 ranks do not divide into EP"):
        resolve("deepseek_v2_lite_pretrain.py", hf_path, "model.expert_tensor_parallel_size=8", "--world-size", "8")


@pytest.mark.parametrize("recipe", ["deepseek_v2_lite_pretrain.py", "deepseek_v2_pretrain.py"])
def test_deepseek_recipes_build_the_query_projection_without_the_norm_hugging_face_lacks(
    recipe: str, output_root: Path, hf_dir: Callable[[str], Path]
):
    """megatron-core 0.19.2 fuses a Q norm into linear_q_proj when q_lora_rank is None (DeepSeek-V2-Lite); HF has
    none, so megatron-bridge 0.6.2 cannot load that weight. If the upstream assertion fails, upstream changed: drop
    recipes/mla_query_projection.py."""
    cfg = resolve(recipe, f"hf_path={hf_dir('deepseek_v2')}")
    assert cfg.model.q_lora_rank is None and cfg.model.qk_layernorm is True
    assert cfg.model.transformer_layer_spec is mla_query_projection.decoder_block_spec
    block = mla_query_projection.decoder_block_spec(cfg.model, pp_rank=0)
    attentions = [layer.submodules.self_attention for layer in block.layer_specs]
    assert len(attentions) == cfg.model.num_layers // cfg.model.pipeline_model_parallel_size
    assert {a.module for a in attentions} == {mla_query_projection.MLASelfAttentionWithPlainQueryProjection}

    # Our override takes effect only while MLASelfAttention builds its projections from this method.
    assert "self._resolve_qk_norm_config(submodules)" in inspect.getsource(MLASelfAttention.__init__)
    submodules = attentions[0].submodules
    upstream = QKNormConfigResolver(cfg.model, submodules).resolve()
    assert upstream["linear_q_proj"] is TELayerNormColumnParallelLinear
    ours = object.__new__(mla_query_projection.MLASelfAttentionWithPlainQueryProjection)
    object.__setattr__(ours, "config", cfg.model)  # the resolver reads only the config, not built modules
    resolved = ours._resolve_qk_norm_config(submodules)
    assert resolved["linear_q_proj"] is TEColumnParallelLinear
    assert resolved["linear_kv_up_proj"] is upstream["linear_kv_up_proj"] is TELayerNormColumnParallelLinear


def test_deepep_switch_selects_the_flex_dispatcher_with_deepep(output_root: Path, hf_dir: Callable[[str], Path]):
    cfg = resolve(
        "deepseek_v2_lite_pretrain.py", f"hf_path={hf_dir('deepseek_v2')}", "moe_token_dispatcher_type=deepep"
    )
    assert cfg.model.moe_token_dispatcher_type == "flex"
    assert cfg.model.moe_flex_dispatcher_backend == "deepep"
    assert cfg.model.moe_shared_expert_overlap is False


def test_unknown_dispatcher_is_refused(output_root: Path, hf_dir: Callable[[str], Path]):
    with pytest.raises(UsageError, match="moe_token_dispatcher_type='deepepp' is not one of allgather, alltoall"):
        resolve("deepseek_v2_lite_pretrain.py", f"hf_path={hf_dir('deepseek_v2')}", "moe_token_dispatcher_type=deepepp")


@pytest.mark.parametrize("recipe", ["tiny_gpt_pretrain.py", "qwen3_30b_a3b_pretrain.py", "deepseek_v2_pretrain.py"])
def test_megatron_fsdp_switch_sets_the_five_settings(recipe: str, output_root: Path, hf_dir):
    shape = SHAPES[recipe.removesuffix(".py")]
    cfg = resolve(recipe, *([f"hf_path={hf_dir(shape)}"] if shape else []), "use_megatron_fsdp=true")
    assert cfg.dist.use_megatron_fsdp is True
    assert cfg.ddp.use_megatron_fsdp is True
    assert cfg.ddp.data_parallel_sharding_strategy == "optim_grads_params"
    assert cfg.ddp.average_in_collective is False
    assert cfg.checkpoint.ckpt_format == "fsdp_dtensor"


def test_llama3_8b_is_offline_with_fsdp_by_default(output_root: Path):
    cfg = resolve("llama3_8b_pretrain.py")
    assert cfg.ddp.use_megatron_fsdp is True
    assert cfg.checkpoint.ckpt_format == "fsdp_dtensor"
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_query_groups) == (32, 4096, 8)
    assert cfg.model.seq_length == 8192
    assert cfg.dataset.blend is None  # mock data


def test_llama3_8b_h200_is_llama3_8b_with_micro_batch_2(output_root: Path):
    """The H200 recipe changes the micro-batch and nothing else (output paths aside, which name the recipe)."""
    base, h200 = resolve("llama3_8b_pretrain.py"), resolve("llama3_8b_h200_pretrain.py")
    assert (base.train.micro_batch_size, h200.train.micro_batch_size) == (1, 2)
    h200.train.micro_batch_size = 1
    for part in ("model", "train", "ddp", "optimizer", "scheduler", "dataset", "mixed_precision", "tokenizer"):
        assert getattr(h200, part) == getattr(base, part), part


def test_llama3_8b_h200_fp8cs_is_the_h200_recipe_in_fp8_on_every_layer_with_the_op_fuser(output_root: Path):
    h200, fp8 = resolve("llama3_8b_h200_pretrain.py"), resolve("llama3_8b_h200_fp8cs_pretrain.py")
    preset = get_mixed_precision_config("bf16_with_fp8_current_scaling_mixed")
    assert preset.first_last_layers_bf16 is True
    assert fp8.mixed_precision == dataclasses.replace(preset, first_last_layers_bf16=False)
    assert (h200.model.use_transformer_engine_op_fuser, fp8.model.use_transformer_engine_op_fuser) == (False, True)
    fp8.model.use_transformer_engine_op_fuser = False
    for part in ("model", "train", "ddp", "optimizer", "scheduler", "dataset", "tokenizer"):
        assert getattr(fp8, part) == getattr(h200, part), part


def test_llama3_8b_h200_fp8cs_mlp_is_te_fused_over_the_same_linear_layers(output_root: Path):
    """Same submodules, so the same parameter names: Hugging Face weights and checkpoints map as before."""
    h200, fp8 = resolve("llama3_8b_h200_pretrain.py"), resolve("llama3_8b_h200_fp8cs_pretrain.py")
    fused, plain = (default_layer_spec(cfg.model).submodules.mlp for cfg in (fp8, h200))
    assert (fused.func.__self__, plain.func.__self__) == (TEFusedMLP, MLP)
    assert fused.keywords["submodules"] == plain.keywords["submodules"]


@pytest.mark.parametrize(
    ("make_dir", "message"),
    [
        (lambda d: d / "missing", "is not a directory: point hf_path at a local Hugging Face model folder"),
        (lambda d: d, "has no config.json: point hf_path at a Hugging Face model folder"),
    ],
)
def test_bad_hf_path_is_refused_with_the_fix(tmp_path: Path, output_root: Path, make_dir, message: str):
    with pytest.raises(UsageError, match=message):
        resolve("deepseek_v2_lite_pretrain.py", f"hf_path={make_dir(tmp_path)}")


def test_hf_path_with_weights_loads_them_before_wrapping(tmp_path: Path):
    from megatron.bridge.recipes.llama.llama3 import llama3_8b_pretrain_config

    weights = hf_models.write("llama", tmp_path / "llama", weights="random")
    cfg = shared.from_hf(llama3_8b_pretrain_config, "meta-llama/Meta-Llama-3-8B", str(weights))
    assert cfg.model.perform_initialization is False
    hooks = cfg.model._pre_wrap_hooks
    assert len(hooks) == 1
    assert hooks[0].__func__ is AutoBridge.load_hf_weights


def test_config_only_hf_path_keeps_random_initialisation(hf_dir: Callable[[str], Path]):
    from megatron.bridge.recipes.llama.llama3 import llama3_8b_pretrain_config

    llama = hf_models.write("llama", hf_dir("llama").parent / "llama_config_only")
    cfg = shared.from_hf(llama3_8b_pretrain_config, "meta-llama/Meta-Llama-3-8B", str(llama))
    assert cfg.model.perform_initialization is True
    assert not getattr(cfg.model, "_pre_wrap_hooks", [])


def test_hub_tokenizer_becomes_local_or_null(tmp_path: Path, hf_dir: Callable[[str], Path]):
    from megatron.bridge.recipes.qwen.h100.qwen3_moe import qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config as qwen

    cfg = shared.from_hf(qwen, "Qwen/Qwen3-30B-A3B", str(hf_dir("qwen3_moe")))
    assert cfg.tokenizer.tokenizer_type == "NullTokenizer"
    assert cfg.tokenizer.vocab_size == 32000
    with_tokenizer = hf_models.write("qwen3_moe", tmp_path / "qwen_tok")
    (with_tokenizer / "tokenizer.json").write_text("{}")
    cfg = shared.from_hf(qwen, "Qwen/Qwen3-30B-A3B", str(with_tokenizer))
    assert cfg.tokenizer.tokenizer_model == str(with_tokenizer)


def test_hub_redirect_is_undone_even_when_the_recipe_fails(hf_dir: Callable[[str], Path]):
    original = AutoBridge.__dict__["from_hf_pretrained"]

    def failing_recipe():
        AutoBridge.from_hf_pretrained("some/hub-id")
        raise ValueError("recipe bug")

    with pytest.raises(ValueError, match="recipe bug"):
        shared.from_hf(failing_recipe, "some/hub-id", str(hf_dir("llama")))
    assert AutoBridge.__dict__["from_hf_pretrained"] is original


def test_hf_path_on_a_recipe_that_reads_another_model_is_refused(hf_dir: Callable[[str], Path]):
    from megatron.bridge.recipes.gpt.vanilla_gpt import vanilla_gpt_pretrain_config

    with pytest.raises(ValueError, match="does not read 'meta-llama/Meta-Llama-3-8B'"):
        shared.from_hf(vanilla_gpt_pretrain_config, "meta-llama/Meta-Llama-3-8B", str(hf_dir("llama")))
