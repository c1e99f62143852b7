"""Process environment a rank needs that depends on its config, set before CUDA starts."""

import importlib.util
import os
import sys

from megatron.bridge.training.config import ConfigContainer


def set_cuda_device_max_connections(cfg: ConfigContainer) -> None:
    """Megatron FSDP refuses CUDA_DEVICE_MAX_CONNECTIONS=1; TP/CP overlap on Hopper wants 1 (docs/launch.md)."""
    current = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
    if cfg.ddp.use_megatron_fsdp:
        if current == "1":
            print("entrypoint.py: Megatron FSDP needs CUDA_DEVICE_MAX_CONNECTIONS > 1; using 8", file=sys.stderr)
            os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "8"
        return
    parallel = cfg.model.tensor_model_parallel_size > 1 or (cfg.model.context_parallel_size or 1) > 1
    if current is None and parallel:
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"


def disable_missing_gradient_accumulation_fusion(cfg: ConfigContainer) -> None:
    """Megatron's non-TE linear layers fuse weight-gradient accumulation with APEX, and refuse to build without it."""
    if cfg.model.gradient_accumulation_fusion and importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is None:
        print("entrypoint.py: APEX is not installed; model.gradient_accumulation_fusion=false", file=sys.stderr)
        cfg.model.gradient_accumulation_fusion = False
