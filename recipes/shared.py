"""Switches every recipe shares, ours or a user's: offline Hugging Face models, the MoE dispatcher, Megatron FSDP.

A recipe calls these on the ConfigContainer it builds; `entrypoint.py` passes the matching `NAME=VALUE` arguments to
the recipe's `configure()`. Each switch raises ValueError with a message a user can act on.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from megatron.bridge import AutoBridge
from megatron.bridge.training.config import ConfigContainer

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
DISPATCHERS = ("allgather", "alltoall", "flex", "deepep")


def local_hf_dir(hf_path: str) -> Path:
    """Check that hf_path is a Hugging Face model directory (config.json, optionally weights)."""
    path = Path(hf_path)
    if not path.is_dir():
        raise ValueError(f"hf_path '{hf_path}' is not a directory: point hf_path at a local Hugging Face model folder")
    if not (path / "config.json").is_file():
        raise ValueError(
            f"hf_path '{hf_path}' has no config.json: point hf_path at a Hugging Face model folder "
            "(the one holding config.json and, for starting weights, *.safetensors)"
        )
    return path


def has_weights(path: Path) -> bool:
    return any(next(path.glob(pattern), None) for pattern in WEIGHT_PATTERNS)


@contextmanager
def hub_id_served_from(hub_id: str, local_dir: Path) -> Iterator[list[AutoBridge]]:
    """While active, AutoBridge.from_hf_pretrained(hub_id) reads local_dir instead of the hub.

    Upstream recipes (megatron-bridge 0.6.2, e.g. deepseek_v2_lite_pretrain_8gpu_h100_bf16_config) build their model
    with `AutoBridge.from_hf_pretrained("<hub id>")` and take no arguments, so this is the one way to keep every other
    upstream setting while reading the architecture offline. Yields the bridges built from local_dir.
    """
    original = AutoBridge.__dict__["from_hf_pretrained"]
    built: list[AutoBridge] = []

    def from_local(cls: type[AutoBridge], path: str | Path, **kwargs: object) -> AutoBridge:
        bridge = original.__func__(cls, local_dir if str(path) == hub_id else path, **kwargs)
        built.append(bridge)
        return bridge

    AutoBridge.from_hf_pretrained = classmethod(from_local)
    try:
        yield built
    finally:
        AutoBridge.from_hf_pretrained = original


def from_hf(upstream: Callable[[], ConfigContainer], hub_id: str, hf_path: str | None) -> ConfigContainer:
    """Build an upstream recipe; with hf_path, its architecture (and starting weights, if present) come from there.

    Without hf_path the upstream recipe reads `hub_id` from the Hugging Face hub, as upstream does.
    """
    if hf_path is None:
        return upstream()
    local_dir = local_hf_dir(hf_path)
    with hub_id_served_from(hub_id, local_dir) as bridges:
        cfg = upstream()
    if not bridges:
        raise ValueError(f"recipe {upstream.__name__} does not read '{hub_id}': hf_path cannot apply to it")
    use_local_tokenizer(cfg, hub_id, local_dir)
    if has_weights(local_dir):
        # Weights are loaded into the built model before DDP/FSDP wraps it; random init would be thrown away.
        cfg.model.perform_initialization = False
        cfg.model.register_pre_wrap_hook(bridges[-1].load_hf_weights)
    return cfg


def use_local_tokenizer(cfg: ConfigContainer, hub_id: str, local_dir: Path) -> None:
    """A recipe whose tokenizer is the hub model's takes it from local_dir, or the null tokenizer if it has none.

    Mock data needs only a vocabulary size; real data needs the model's tokenizer files next to config.json.
    """
    if cfg.tokenizer.tokenizer_model != hub_id:
        return
    cfg.tokenizer.hf_tokenizer_kwargs = {}
    if next(local_dir.glob("tokenizer*"), None):
        cfg.tokenizer.tokenizer_model = str(local_dir)
        return
    cfg.tokenizer.tokenizer_type = "NullTokenizer"
    cfg.tokenizer.tokenizer_model = None
    cfg.tokenizer.vocab_size = cfg.model.vocab_size


def set_moe_dispatcher(cfg: ConfigContainer, dispatcher: str | None) -> None:
    """Choose the MoE token dispatcher; 'deepep' is the flex dispatcher with the DeepEP backend."""
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


def set_megatron_fsdp(cfg: ConfigContainer, enabled: bool) -> None:
    """Megatron FSDP with fully sharded optimizer state, gradients and parameters, and its checkpoint format."""
    if not enabled:
        return
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
) -> ConfigContainer:
    """Apply every shared switch a recipe exposes as a configure() keyword."""
    set_moe_dispatcher(cfg, moe_token_dispatcher_type)
    set_megatron_fsdp(cfg, use_megatron_fsdp)
    return cfg
