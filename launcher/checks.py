"""Checks of a resolved config that Megatron Bridge would otherwise make late (after distributed init, on every rank,
as an assertion) or never. Each failure is a UsageError naming the fix."""

from megatron.bridge.training.config import ConfigContainer

from launcher.errors import UsageError
from viztracer_plugin import active_profilers


def check_config(cfg: ConfigContainer, world_size: int | None) -> None:
    check_profiling(cfg)
    check_megatron_fsdp(cfg)
    check_cpu_offloading(cfg)
    if world_size is not None:
        check_parallelism(cfg, world_size)


def check_profiling(cfg: ConfigContainer) -> None:
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


def check_megatron_fsdp(cfg: ConfigContainer) -> None:
    if cfg.dist.use_megatron_fsdp != cfg.ddp.use_megatron_fsdp:
        raise UsageError(
            "dist.use_megatron_fsdp and ddp.use_megatron_fsdp differ: set both, or pass use_megatron_fsdp=true"
        )
    if not cfg.dist.use_megatron_fsdp:
        return
    if cfg.dist.use_torch_fsdp2:
        raise UsageError("Megatron FSDP and torch FSDP2 exclude each other: set dist.use_torch_fsdp2=false")
    if cfg.dist.use_tp_pp_dp_mapping:
        raise UsageError("Megatron FSDP does not support dist.use_tp_pp_dp_mapping: set it to false")
    saves_or_loads = cfg.checkpoint.save is not None or cfg.checkpoint.load is not None
    if saves_or_loads and cfg.checkpoint.ckpt_format != "fsdp_dtensor":
        raise UsageError(
            "Megatron FSDP saves and loads only checkpoint.ckpt_format=fsdp_dtensor,"
            f" not {cfg.checkpoint.ckpt_format!r}: set checkpoint.ckpt_format=fsdp_dtensor"
        )


def check_cpu_offloading(cfg: ConfigContainer) -> None:
    model = cfg.model
    if not getattr(model, "cpu_offloading", False):
        return
    if model.pipeline_model_parallel_size > 1:
        raise UsageError("model.cpu_offloading needs model.pipeline_model_parallel_size=1: turn one of them off")
    if model.recompute_granularity is not None:
        raise UsageError("model.cpu_offloading excludes activation recompute: set model.recompute_granularity=null")


def check_parallelism(cfg: ConfigContainer, world_size: int) -> None:
    """The rank arithmetic Megatron checks only after every rank has joined the process group."""
    model = cfg.model
    tp, pp = model.tensor_model_parallel_size, model.pipeline_model_parallel_size
    cp = model.context_parallel_size or 1
    if world_size % (tp * pp * cp):
        raise UsageError(
            f"{world_size} ranks do not divide into TP*PP*CP = {tp}*{pp}*{cp}: change the node count or GPUS_PER_NODE,"
            " or the model.*_parallel_size overrides"
        )
    ep = model.expert_model_parallel_size or 1
    etp = model.expert_tensor_parallel_size or tp
    if ep > 1 and world_size % (ep * etp * pp):
        raise UsageError(
            f"{world_size} ranks do not divide into EP*ETP*PP = {ep}*{etp}*{pp}: change the node count,"
            " model.expert_model_parallel_size or model.expert_tensor_parallel_size"
        )
    data_parallel = world_size // (tp * pp * cp)
    gbs, mbs = cfg.train.global_batch_size, cfg.train.micro_batch_size
    if gbs is not None and gbs % (mbs * data_parallel):
        raise UsageError(
            f"train.global_batch_size={gbs} is not a multiple of micro_batch_size*data_parallel = {mbs}*{data_parallel}"
            f" on {world_size} ranks: change train.global_batch_size"
        )
    outside = [rank for rank in profiled_ranks(cfg, world_size) if rank >= world_size]
    if active_profilers(cfg.profiling) and outside:
        raise UsageError(
            f"profiling.profile_ranks={cfg.profiling.profile_ranks} names ranks outside 0..{world_size - 1}:"
            " list ranks of this job"
        )


def profiled_ranks(cfg: ConfigContainer, world_size: int) -> list[int]:
    """The global ranks the profilers act on; Megatron Bridge reads an empty profile_ranks as every rank."""
    ranks = list(cfg.profiling.profile_ranks) if cfg.profiling is not None else [0]
    return ranks or list(range(world_size))
