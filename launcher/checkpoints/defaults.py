"""What a batch job or an in-process-restart launch saves (docs/failures.md, "In the code")."""

import os
from pathlib import Path

from megatron.bridge.training.config import ConfigContainer

from launcher.errors import UsageError, from_srun_sh

ASYNC_FORMATS = ("torch_dist", "fsdp_dtensor")  # the formats Megatron Bridge 0.6.2 saves asynchronously
LOCAL = "torch_dist"  # the format whose sharded state nvidia-resiliency-ext's local checkpoints hold
KEY = "checkpoint."


def apply(cfg: ConfigContainer, given: set[str]) -> None:
    """async_save=true's strategy, as its config class sets it; local checkpoints on SRUNSH_LOCAL_CKPT_DIR (docs)."""
    ckpt, root = cfg.checkpoint, from_srun_sh("SRUNSH_LOCAL_CKPT_DIR")  # srun.sh checked the node's directory
    if ckpt.async_save and ckpt.async_strategy == "mcore" and f"{KEY}async_strategy" not in given:
        ckpt.async_strategy = "nvrx"  # as CheckpointConfig(async_save=True) has it: mcore drops local saves
    local = root not in (None, "", "off") and ckpt.non_persistent_ckpt_type == "local"
    if local and f"{KEY}non_persistent_local_ckpt_dir" not in given:
        run = Path(root) / f"srunsh-local-ckpt-uid{os.getuid()}" / os.environ.get("RUN_ID", "run")
        ckpt.non_persistent_local_ckpt_dir = str(run)


def to_choose(cfg: ConfigContainer, given: set[str]) -> set[str]:
    """The intervals neither the command line nor the recipe set, which training chooses (intervals.py)."""
    ckpt, keeps = cfg.checkpoint, from_srun_sh("SRUNSH_KEEP_WORK") == "1"
    persistent = keeps and f"{KEY}save_interval" not in given and not ckpt.save_interval
    local = keeps and ckpt.non_persistent_ckpt_type == "local" and not ckpt.non_persistent_save_interval
    local = local and f"{KEY}non_persistent_save_interval" not in given
    return {kind for kind, open_ in (("save_interval", persistent), ("non_persistent_save_interval", local)) if open_}


def check(cfg: ConfigContainer) -> None:
    """What Megatron Bridge refuses or fails on only after start-up, on every rank."""
    ckpt = cfg.checkpoint
    if ckpt.async_save and ckpt.ckpt_format not in ASYNC_FORMATS:
        raise UsageError(
            f"checkpoint.async_save=true cannot save checkpoint.ckpt_format={ckpt.ckpt_format}: Megatron Bridge writes"
            f" asynchronously only {' and '.join(ASYNC_FORMATS)}: set ckpt_format=torch_dist, or drop async_save"
        )
    if ckpt.non_persistent_ckpt_type != "local":
        return
    if ckpt.async_save and ckpt.async_strategy == "mcore":
        raise UsageError(
            "checkpoint.async_strategy=mcore never writes local checkpoints (Megatron Core's writer drops"
            " nvidia-resiliency-ext's requests): drop checkpoint.async_strategy, or set it to nvrx"
        )
    if ckpt.ckpt_format != LOCAL:
        raise UsageError(
            f"checkpoint.non_persistent_ckpt_type=local holds Megatron Core's sharded state, which ckpt_format="
            f"{ckpt.ckpt_format} is not: drop it, or use ckpt_format={LOCAL} (Megatron FSDP: use_megatron_fsdp=false)"
        )
    if not ckpt.non_persistent_local_ckpt_dir:
        raise UsageError(
            "checkpoint.non_persistent_ckpt_type=local has no directory: launch it with srun.sh, whose"
            " SRUNSH_LOCAL_CKPT_DIR places it on each node's disk, or set checkpoint.non_persistent_local_ckpt_dir"
        )


def describe(cfg: ConfigContainer, to_choose: set[str]) -> str:
    """One line: what this run saves, where and how often; or that a failure loses every step."""
    ckpt, parts = cfg.checkpoint, []
    often = {kind: f"every {getattr(ckpt, kind)} step(s)" for kind in ("save_interval", "non_persistent_save_interval")}
    often |= dict.fromkeys(to_choose, "as often as its measured cost is worth")
    if ckpt.save and (ckpt.save_interval or "save_interval" in to_choose):
        how = "asynchronously" if ckpt.async_save else "synchronously (every rank waits for the write)"
        parts.append(f"persistent checkpoints {how} to {ckpt.save} {often['save_interval']}")
    local = "non_persistent_save_interval" in to_choose or ckpt.non_persistent_save_interval
    if ckpt.save and ckpt.non_persistent_ckpt_type == "local" and local:
        where = ckpt.non_persistent_local_ckpt_dir
        parts.append(f"local checkpoints on each node's {where} {often['non_persistent_save_interval']}")
    if not parts:
        return (
            "saves no checkpoint (checkpoint.save_interval is 0): a failure loses every step; set checkpoint."
            "save_interval=N, or launch with inprocess_restart.enabled=true or --sbatch, which save by default"
        )
    return "saves " + "; ".join(parts)
