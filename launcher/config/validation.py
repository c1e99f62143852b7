"""Megatron Bridge's own validation of a resolved config (runtime_config_update, ending in ConfigContainer.validate())
on a copy, for the ranks that train, and what upstream leaves to a later failure on every rank: CUDA graphs without
TE's RNG tracker, expert parallelism that does not divide the ranks. Each failure is a one-line UsageError.
"""

import copy
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from megatron.bridge.training.config import ConfigContainer, runtime_config_update

from launcher.config.run_env import set_cuda_device_max_connections
from launcher.errors import UsageError, first_line

# What Megatron Bridge's validation raises for a config it refuses (its checks are asserts and ValueErrors).
REFUSALS = (AssertionError, ValueError, TypeError, KeyError, NotImplementedError)


def check_upstream(cfg: ConfigContainer, world_size: int | None) -> None:
    """world_size: the ranks that train, None where unknown (then only what needs no job is checked)."""
    check_cuda_graph_rng(cfg)
    if world_size is not None:
        validated = upstream_validated(cfg, world_size)
        check_expert_parallelism(validated or cfg, world_size)


def check_cuda_graph_rng(cfg: ConfigContainer) -> None:
    """Megatron Bridge's validation passes CUDA graphs without TE's RNG tracker; its model provider refuses them."""
    impl = getattr(cfg.model, "cuda_graph_impl", "none")
    if impl != "none" and not (getattr(cfg.model, "use_te_rng_tracker", False) or cfg.rng.te_rng_tracker):
        raise UsageError(
            f"model.cuda_graph_impl={impl} needs Transformer Engine's RNG tracker: add model.use_te_rng_tracker=true"
        )


@contextmanager
def job_environment(cfg: ConfigContainer, world_size: int) -> Iterator[None]:
    """The environment the job's ranks will have, while the check runs: Megatron Bridge reads WORLD_SIZE and
    CUDA_DEVICE_MAX_CONNECTIONS (set per job), and its runtime update exports the recipe's env_vars."""
    before = dict(os.environ)
    os.environ["WORLD_SIZE"] = str(world_size)
    set_cuda_device_max_connections(cfg)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


def upstream_validated(cfg: ConfigContainer, world_size: int) -> ConfigContainer | None:
    """A copy of cfg after what pretrain() does to it before initializing anything (runtime_config_update(): the
    mixed-precision and overlap settings, then validate(), which fills in expert TP and DP size). None without a GPU
    where validate() asks for one (DeepEP's dispatcher): every rank validates again on its GPU before distributed init.
    """
    validated = copy.deepcopy(cfg)
    with job_environment(validated, world_size):
        try:
            runtime_config_update(validated)
        except REFUSALS as error:
            raise UsageError(
                f"Megatron Bridge refuses this config for {world_size} ranks: {first_line(error)}"
                " (ConfigContainer.validate(); change the override it names)"
            ) from None
        except RuntimeError:
            if torch.cuda.is_available():
                raise
            return None
    return validated


def check_expert_parallelism(validated: ConfigContainer, world_size: int) -> None:
    """Megatron checks this only once every rank has joined the process group."""
    model = validated.model
    ep, pp = model.expert_model_parallel_size or 1, model.pipeline_model_parallel_size
    # Unvalidated (no GPU here), expert TP may still be unset: Megatron Bridge makes it 1 under expert parallelism.
    etp = model.expert_tensor_parallel_size or 1
    if ep > 1 and world_size % (ep * etp * pp):
        raise UsageError(
            f"{world_size} ranks do not divide into EP*ETP*PP = {ep}*{etp}*{pp}: change the node count,"
            " model.expert_model_parallel_size or model.expert_tensor_parallel_size"
        )
