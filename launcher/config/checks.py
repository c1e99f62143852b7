"""Every check of a resolved config before any rank joins the job, each failure a one-line UsageError: its profilers
(one at most, a window inside the run, ranks inside the job), then Megatron Bridge's validation and what upstream leaves
to a later failure (launcher/config/validation.py), in-process restart's (launcher/restart/inprocess.py) and the data's
(launcher/config/data.py), in that order."""

from megatron.bridge.training.config import ConfigContainer

from launcher.config import data, validation
from launcher.errors import UsageError
from launcher.restart import inprocess
from viztracer_plugin import active_profilers


def check_config(cfg: ConfigContainer, world_size: int | None) -> None:
    """Every check, in the order a user meets their errors; world_size: the job's ranks, None where unknown (then
    what depends on it is left out)."""
    training = training_world_size(cfg, world_size)
    check_profiling(cfg, training)
    validation.check_upstream(cfg, training)
    inprocess.check_restart(cfg, world_size)
    data.check_data(cfg)


def training_world_size(cfg: ConfigContainer, world_size: int | None) -> int | None:
    """The ranks that train: with in-process restart, active_world_size of them; the rest are warm spares."""
    restart = cfg.inprocess_restart
    if world_size is None or restart is None or not restart.enabled or restart.active_world_size is None:
        return world_size
    return restart.active_world_size


def check_profiling(cfg: ConfigContainer, world_size: int | None) -> None:
    """One profiler at most, its window inside the run and, where world_size (the ranks that train) is known, its
    ranks inside the job."""
    outside = [] if world_size is None else [rank for rank in profiled_ranks(cfg, world_size) if rank >= world_size]
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
    if outside:
        raise UsageError(
            f"profiling.profile_ranks={cfg.profiling.profile_ranks} names ranks outside 0..{world_size - 1}:"
            " list ranks of this job"
        )


def profiled_ranks(cfg: ConfigContainer, world_size: int) -> list[int]:
    """The global ranks the profilers act on; Megatron Bridge reads an empty profile_ranks as every rank."""
    ranks = list(cfg.profiling.profile_ranks) if cfg.profiling is not None else [0]
    return ranks or list(range(world_size))
