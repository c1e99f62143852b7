"""Every check of a resolved config before any rank joins the job, each a one-line UsageError (docs/checks.md)."""

import copy
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from megatron.bridge.training.config import ConfigContainer, runtime_config_update

from launcher import trackers
from launcher.checkpoints import defaults
from launcher.config import data
from launcher.config.run_env import set_cuda_device_max_connections
from launcher.errors import UsageError, first_line
from launcher.restart import inprocess
from viztracer_plugin import active_profilers

# What Megatron Bridge's validation raises for a config it refuses (its checks are asserts and ValueErrors).
REFUSALS = (AssertionError, ValueError, TypeError, KeyError, NotImplementedError)


def check_config(cfg: ConfigContainer, world_size: int | None) -> None:
    """Every check, in the order a user meets their errors; world_size None: what depends on it is left out."""
    # With in-process restart, active_world_size of the job's ranks train; the rest are warm spares.
    restart = cfg.inprocess_restart
    active = restart.active_world_size if restart is not None and restart.enabled else None
    training = world_size if world_size is None or active is None else active
    check_profiling(cfg, training)
    trackers.check(cfg)
    check_cuda_graph_rng(cfg)
    if training is not None:
        check_expert_parallelism(upstream_validated(cfg, training) or cfg, training)
    inprocess.check_restart(cfg, world_size)
    defaults.check(cfg)
    data.check_data(cfg)


def check_profiling(cfg: ConfigContainer, world_size: int | None) -> None:
    """One profiler at most, its window inside the run and its ranks inside the job (the ranks that train)."""
    profilers = active_profilers(cfg.profiling)
    if len(profilers) > 1:
        listed = " and ".join(f"profiling.{name}" for name in profilers)
        raise UsageError(f"{listed} are all on: enable one profiler per run")
    if not profilers:
        return
    start, end = cfg.profiling.profile_step_start, cfg.profiling.profile_step_end
    iters = cfg.train.train_iters
    if not 0 <= start < end or (iters is not None and end > iters):
        raise UsageError(
            f"profiling window profile_step_start={start}..profile_step_end={end} is outside train.train_iters={iters}:"
            " pick 0 <= profile_step_start < profile_step_end <= train.train_iters"
        )
    if world_size is not None and any(rank >= world_size for rank in profiled_ranks(cfg, world_size)):
        raise UsageError(
            f"profiling.profile_ranks={cfg.profiling.profile_ranks} names ranks outside 0..{world_size - 1}:"
            " list ranks of this job"
        )


def profiled_ranks(cfg: ConfigContainer, world_size: int) -> list[int]:
    """The global ranks the profilers act on; Megatron Bridge reads an empty profile_ranks as every rank."""
    ranks = list(cfg.profiling.profile_ranks) if cfg.profiling is not None else [0]
    return ranks or list(range(world_size))


def check_cuda_graph_rng(cfg: ConfigContainer) -> None:
    """Megatron Bridge's validation passes CUDA graphs without TE's RNG tracker; its model provider refuses them."""
    impl = getattr(cfg.model, "cuda_graph_impl", "none")
    if impl != "none" and not (getattr(cfg.model, "use_te_rng_tracker", False) or cfg.rng.te_rng_tracker):
        raise UsageError(
            f"model.cuda_graph_impl={impl} needs Transformer Engine's RNG tracker: add model.use_te_rng_tracker=true"
        )


@contextmanager
def job_environment(cfg: ConfigContainer, world_size: int) -> Iterator[None]:
    """The environment the job's ranks will have (WORLD_SIZE, CUDA_DEVICE_MAX_CONNECTIONS), while the check runs."""
    before = dict(os.environ)
    os.environ["WORLD_SIZE"] = str(world_size)
    set_cuda_device_max_connections(cfg)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


def upstream_validated(cfg: ConfigContainer, world_size: int) -> ConfigContainer | None:
    """A copy of cfg after pretrain()'s runtime_config_update(); None without a GPU where it needs one."""
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
