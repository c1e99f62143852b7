"""The rank's side of in-process restart: upstream's late checks made early, and the dropped CallWrapper passed."""

import inspect
import os
from collections.abc import Callable

import torch
from megatron.bridge.training.config import ConfigContainer, InProcessRestartConfig

from launcher.errors import UsageError, from_srun_sh
from launcher.restart.plan import plan


def pass_the_call_wrapper() -> None:
    """Gives upstream's adapter around _pretrain the CallWrapper parameter NVRx looks for (docs/failures.md)."""
    from megatron.bridge.training import inprocess_restart as bridge
    from nvidia_resiliency_ext.inprocess import CallWrapper

    build = bridge.inprocess_restart
    kind = inspect.Parameter
    call_wrapper = kind("inprocess_call_wrapper", kind.KEYWORD_ONLY, default=None, annotation=CallWrapper)
    signature = inspect.Signature([kind("args", kind.VAR_POSITIONAL), call_wrapper, kind("kwargs", kind.VAR_KEYWORD)])

    def inprocess_restart(train_fn: Callable, config: InProcessRestartConfig, state: object) -> Callable:
        wrapped = build(train_fn, config, state)
        wrapped.__wrapped__.__signature__ = signature  # the adapter, under NVRx's functools.wraps
        return wrapped

    bridge.inprocess_restart = inprocess_restart


def restart_enabled(cfg: ConfigContainer) -> bool:
    return cfg.inprocess_restart is not None and cfg.inprocess_restart.enabled


def check_restart(cfg: ConfigContainer, world_size: int | None) -> None:
    if not restart_enabled(cfg):
        return
    check_timeouts(cfg.inprocess_restart)
    # srun.sh learns of in-process restart from the command line only: not from a recipe that turns it on.
    if from_srun_sh("SRUNSH_INPROCESS") not in ("1", None):
        raise UsageError(
            "the recipe turns in-process restart on, but srun.sh started the ranks without it, so the job would still"
            " end at the first failed rank: add inprocess_restart.enabled=true to the command line"
        )
    if world_size is not None:
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
        check_node_layer(cfg.inprocess_restart, per_node)
        config = cfg.inprocess_restart  # the launching host's plan (launcher/restart/plan.py), for the resolved config
        plan(
            [f"inprocess_restart.{name}={getattr(config, name)}" for name in ("active_world_size", "granularity")]
            + ["inprocess_restart.enabled=true"],
            nodes=max(1, world_size // per_node) if per_node else 1,
            ranks_per_node=per_node or world_size,
            master_port=int(os.environ.get("MASTER_PORT", "0")),
        )


def check_timeouts(config: InProcessRestartConfig) -> None:
    """nvidia-resiliency-ext's Wrapper refuses other orders with a ValueError on every rank, after start-up."""
    soft, hard, barrier = config.soft_timeout, config.hard_timeout, config.barrier_timeout
    if not soft < hard < barrier:
        raise UsageError(
            f"inprocess_restart timeouts soft_timeout={soft:g} < hard_timeout={hard:g} < barrier_timeout={barrier:g}"
            " do not hold, which nvidia-resiliency-ext requires: make each larger than the one before"
        )
    if config.heartbeat_interval >= config.heartbeat_timeout:
        raise UsageError(
            f"inprocess_restart.heartbeat_interval={config.heartbeat_interval:g} is not below heartbeat_timeout="
            f"{config.heartbeat_timeout:g}: a rank would count as missing between two heartbeats; lower the interval"
        )


def check_node_layer(config: InProcessRestartConfig, per_node: int) -> None:
    """NVRx's per-node layer is sized by the GPUs a node shows: a node must run one rank per GPU."""
    if config.granularity != "node" or not per_node or not torch.cuda.is_available():
        return
    devices = torch.cuda.device_count()
    if devices != per_node:
        raise UsageError(
            f"inprocess_restart.granularity=node needs one rank per visible GPU, but this node runs {per_node} rank(s)"
            f" and shows {devices} GPU(s): set SRUNSH_GPUS_PER_NODE={devices}, or inprocess_restart.granularity=rank"
        )
