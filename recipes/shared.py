"""Switches every recipe shares (from_hf, apply_switches): configure() keywords it hands on; docs/checks.md."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from megatron.bridge.recipes.utils.dataset_utils import get_blend_fields_from_data_paths
from megatron.bridge.training.config import ConfigContainer, GPTDatasetConfig, MockGPTDatasetConfig

if TYPE_CHECKING:
    from megatron.bridge import AutoBridge

DataPaths = list[str | float] | str | None  # data_paths=[0.7,/fsx/a,0.3,/fsx/b], or Megatron's "0.7 /fsx/a 0.3 /fsx/b"
DISPATCHERS = ("allgather", "alltoall", "flex", "deepep")


def from_hf(upstream: Callable[[], ConfigContainer], hub_id: str, hf_path: str | None) -> ConfigContainer:
    """Build an upstream recipe; with hf_path, its architecture (and weights, if any) come from there, not `hub_id`."""
    if hf_path is None:
        return upstream()
    local_dir = Path(hf_path)
    if not local_dir.is_dir():
        raise ValueError(f"hf_path '{hf_path}' is not a directory: point hf_path at a local Hugging Face model folder")
    if not (local_dir / "config.json").is_file():
        raise ValueError(
            f"hf_path '{hf_path}' has no config.json: point hf_path at a Hugging Face model folder "
            "(the one holding config.json and, for starting weights, *.safetensors)"
        )
    with hub_id_served_from(hub_id, local_dir) as bridges:
        cfg = upstream()
    if not bridges:
        raise ValueError(f"recipe {upstream.__name__} does not read '{hub_id}': hf_path cannot apply to it")
    if cfg.tokenizer.tokenizer_model == hub_id:
        use_local_tokenizer(cfg, local_dir)
    if any(next(local_dir.glob(pattern), None) for pattern in ("*.safetensors", "pytorch_model*.bin")):
        # Weights are loaded into the built model before DDP/FSDP wraps it; random init would be thrown away.
        cfg.model.perform_initialization = False
        cfg.model.register_pre_wrap_hook(bridges[-1].load_hf_weights)
    return cfg


@contextmanager
def hub_id_served_from(hub_id: str, local_dir: Path) -> Iterator[list[AutoBridge]]:
    """While active, AutoBridge.from_hf_pretrained(hub_id) reads local_dir; yields bridges built (docs/checks.md)."""
    from megatron.bridge import AutoBridge  # Hugging Face conversion imports every model bridge: only with hf_path

    original = AutoBridge.__dict__["from_hf_pretrained"]
    built: list[AutoBridge] = []

    def from_local(cls: type[AutoBridge], path: str | Path, **kwargs: object) -> AutoBridge:
        built.append(original.__func__(cls, local_dir if str(path) == hub_id else path, **kwargs))
        return built[-1]

    AutoBridge.from_hf_pretrained = classmethod(from_local)
    try:
        yield built
    finally:
        AutoBridge.from_hf_pretrained = original


def use_local_tokenizer(cfg: ConfigContainer, local_dir: Path) -> None:
    """The hub model's tokenizer from local_dir, else the null tokenizer (mock data needs only a vocabulary size)."""
    cfg.tokenizer.hf_tokenizer_kwargs = {}
    if has_tokenizer(local_dir):
        cfg.tokenizer.tokenizer_model = str(local_dir)
        return
    cfg.tokenizer.tokenizer_type = "NullTokenizer"
    cfg.tokenizer.tokenizer_model = None
    cfg.tokenizer.vocab_size = cfg.model.vocab_size


def has_tokenizer(path: Path) -> bool:
    return next(path.glob("tokenizer*"), None) is not None  # tokenizer.json, tokenizer_config.json, tokenizer.model


def is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def blend_list(data_paths: list[str | float] | str) -> list[str]:
    """data_paths as the list Megatron's --data-path takes: prefixes, or weight and prefix pairs."""
    words = data_paths.split() if isinstance(data_paths, str) else [str(word) for word in data_paths]
    example = "data_paths=/fsx/data/web, data_paths=[/fsx/a,/fsx/b] or data_paths=[0.7,/fsx/a,0.3,/fsx/b]"
    if not words:
        raise ValueError(f"data_paths is empty: give the prefix of each prepared dataset, e.g. {example}")
    weights, prefixes = words[0::2], words[1::2]
    weighted = len(words) % 2 == 0 and all(map(is_number, weights)) and not any(map(is_number, prefixes))
    if weighted and any(float(weight) <= 0 for weight in weights):
        raise ValueError(f"data_paths '{' '.join(words)}' has a weight of 0 or less: each weight must be above 0")
    if not weighted and any(map(is_number, words)):
        raise ValueError(
            f"data_paths '{' '.join(words)}' mixes numbers and prefixes: give prefixes, or WEIGHT PREFIX pairs:"
            f" {example}"
        )
    return words


def set_data(cfg: ConfigContainer, data_paths: DataPaths, tokenizer_path: str | None, hf_path: str | None) -> None:
    """Train on data_paths' indexed datasets, not mock data, with tokenizer_path or hf_path's (docs/data.md)."""
    if tokenizer_path is None and data_paths is not None and hf_path is not None and has_tokenizer(Path(hf_path)):
        tokenizer_path = hf_path
    if tokenizer_path is not None:
        cfg.tokenizer.tokenizer_type = "HuggingFaceTokenizer"
        cfg.tokenizer.tokenizer_model = tokenizer_path
        cfg.tokenizer.hf_tokenizer_kwargs = {}
        cfg.tokenizer.vocab_size = None  # the tokenizer's own
    if data_paths is None:
        return
    if not isinstance(cfg.dataset, GPTDatasetConfig) or isinstance(cfg.dataset, MockGPTDatasetConfig):
        kind = type(cfg.dataset).__name__
        raise ValueError(
            f"data_paths needs a GPTDatasetConfig, but this recipe's dataset is a {kind}: change the recipe"
        )
    blend, blend_per_split, _ = get_blend_fields_from_data_paths(data_paths=blend_list(data_paths))
    cfg.dataset.blend, cfg.dataset.blend_per_split = blend, blend_per_split


def set_moe_dispatcher(cfg: ConfigContainer, dispatcher: str | None) -> None:
    """'deepep' is the flex dispatcher with the DeepEP backend."""
    if dispatcher is None:
        return
    if dispatcher not in DISPATCHERS:
        raise ValueError(f"moe_token_dispatcher_type={dispatcher!r} is not one of {', '.join(DISPATCHERS)}")
    if dispatcher == "deepep":
        cfg.model.moe_token_dispatcher_type = "flex"
        cfg.model.moe_flex_dispatcher_backend = "deepep"
        # DeepEP's dispatch and combine kernels occupy the SMs the shared-expert overlap would use.
        cfg.model.moe_shared_expert_overlap = False
    else:
        cfg.model.moe_token_dispatcher_type = dispatcher


def set_megatron_fsdp(cfg: ConfigContainer) -> None:
    """Megatron FSDP with fully sharded optimizer state, gradients and parameters, and its checkpoint format."""
    cfg.dist.use_megatron_fsdp = True
    cfg.ddp.use_megatron_fsdp = True
    cfg.ddp.data_parallel_sharding_strategy = "optim_grads_params"
    # Upstream's Megatron FSDP guidance (seed 003) and performance scripts turn this off together with FSDP.
    cfg.ddp.average_in_collective = False
    cfg.checkpoint.ckpt_format = "fsdp_dtensor"


def apply_switches(
    cfg: ConfigContainer,
    *,
    moe_token_dispatcher_type: str | None = None,
    use_megatron_fsdp: bool = False,
    data_paths: DataPaths = None,
    tokenizer_path: str | None = None,
    hf_path: str | None = None,
) -> ConfigContainer:
    """Apply every shared switch a recipe exposes as a configure() keyword (hf_path: where from_hf read the model)."""
    set_moe_dispatcher(cfg, moe_token_dispatcher_type)
    if use_megatron_fsdp:
        set_megatron_fsdp(cfg)
    set_data(cfg, data_paths, tokenizer_path, hf_path)
    return cfg
