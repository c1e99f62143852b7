"""Process environment a rank needs that depends on its config, set before CUDA starts."""

import os
import sys

from megatron.bridge.training.config import ConfigContainer
from megatron.core.tensor_parallel import layers as tensor_parallel_layers


def set_cuda_device_max_connections(cfg: ConfigContainer) -> None:
    """Megatron FSDP refuses CUDA_DEVICE_MAX_CONNECTIONS=1; tensor/context parallel overlap on Hopper wants 1.

    With one hardware queue, the communication kernels of TP/CP are scheduled ahead of the compute that follows them,
    which is what Megatron's overlap relies on. FSDP instead needs several queues to overlap its own collectives.
    """
    current = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
    if cfg.ddp.use_megatron_fsdp:
        if current == "1":
            print("entrypoint.py: Megatron FSDP needs CUDA_DEVICE_MAX_CONNECTIONS > 1; using 8", file=sys.stderr)
            os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "8"
        return
    parallel = cfg.model.tensor_model_parallel_size > 1 or (cfg.model.context_parallel_size or 1) > 1
    if current is None and parallel:
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"


def fit_gradient_accumulation_fusion(cfg: ConfigContainer) -> None:
    """Keep gradient_accumulation_fusion where it can run without APEX; turn it off where it cannot.

    Megatron's non-TE linear layers (the output layer among them) refuse to build with the fusion unless APEX's
    fused_weight_gradient_mlp_cuda imports. Under Megatron FSDP every parameter is an FSDP parameter, whose weight
    gradient those layers accumulate with Transformer Engine's GEMM, not APEX's (megatron-core 0.19,
    tensor_parallel/layers.py), so there the refusal is lifted and the fusion stays on, as upstream's FSDP
    performance configs run it. Without FSDP, APEX is needed: the fusion is turned off.
    """
    if not cfg.model.gradient_accumulation_fusion or tensor_parallel_layers._grad_accum_fusion_available:
        return
    if cfg.ddp.use_megatron_fsdp:
        tensor_parallel_layers._grad_accum_fusion_available = True
        return
    print("entrypoint.py: APEX is not installed; model.gradient_accumulation_fusion=false", file=sys.stderr)
    cfg.model.gradient_accumulation_fusion = False
