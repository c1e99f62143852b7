"""Where a run writes: every output path carries the recipe and the run id, so two jobs never share a directory and a
new job never resumes from another job's checkpoints.

    $OUTPUT_ROOT/<recipe>/<RUN_ID>/  config.yaml  launch.json  checkpoints/  tb_logs/  viztracer/
"""

import json
import os
import sys
from importlib import metadata
from pathlib import Path

from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.utils import omegaconf_utils
from omegaconf import OmegaConf

# Megatron Bridge 0.6 recipes default to <cwd>/nemo_experiments/default/..., shared by every run started there.
UPSTREAM_DEFAULT = Path.cwd() / "nemo_experiments" / "default"
RECORDED_ENV_PREFIXES = ("SLURM_", "NCCL_", "FI_", "CUDA_", "TORCH_", "PYTORCH_", "NVTE_", "DEEP_EP_", "OMP_", "HF_")
RECORDED_ENV_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RUN_ID")
SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "KEY")
PACKAGES = ("torch", "megatron-core", "megatron-bridge", "transformer-engine", "viztracer")


def run_id() -> str:
    """The launcher's RUN_ID (the SLURM job id on a cluster); a bare `python entrypoint.py` falls back to its pid."""
    return os.environ.get("RUN_ID") or os.environ.get("SLURM_JOB_ID") or f"pid{os.getpid()}"


def run_dir(recipe: Path) -> Path:
    return Path(os.environ.get("OUTPUT_ROOT", "outputs")).absolute() / recipe.stem / run_id()


def place_outputs(cfg: ConfigContainer, directory: Path) -> None:
    """Move the outputs the recipe left at upstream's shared default into this run's directory."""
    for section, field, leaf in (
        (cfg.checkpoint, "save", "checkpoints"),
        (cfg.checkpoint, "load", "checkpoints"),
        (cfg.logger, "tensorboard_dir", "tb_logs"),
    ):
        value = getattr(section, field)
        if value is not None and Path(value).is_relative_to(UPSTREAM_DEFAULT):
            setattr(section, field, str(directory / leaf))
    os.environ.setdefault("VIZTRACER_OUTPUT_DIR", str(directory / "viztracer"))


def config_yaml(cfg: ConfigContainer) -> str:
    tree, _ = omegaconf_utils.create_omegaconf_dict_config(cfg)
    return OmegaConf.to_yaml(tree)


def recorded_environment() -> dict[str, str]:
    return {
        name: value
        for name, value in sorted(os.environ.items())
        if (name.startswith(RECORDED_ENV_PREFIXES) or name in RECORDED_ENV_NAMES)
        and not any(marker in name for marker in SECRET_MARKERS)
    }


def save_run_record(cfg: ConfigContainer, directory: Path) -> None:
    """config.yaml (the resolved config) and launch.json (command, environment, versions) for reproducing the run."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.yaml").write_text(config_yaml(cfg))
    record = {
        "argv": sys.argv,
        "environment": recorded_environment(),
        "versions": {name: metadata.version(name) for name in PACKAGES},
    }
    (directory / "launch.json").write_text(json.dumps(record, indent=2) + "\n")
