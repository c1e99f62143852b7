"""The experiment trackers W&B and MLflow: checked, offline into RUN_DIR (docs/launch.md). Standard library only."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from launcher.assignments import section, split
from launcher.errors import UsageError, q, say, stack_fix

# The field that turns a tracker on: its package, and the fields that mean nothing without it.
TRACKERS = {
    "wandb_project": ("wandb", ("wandb_exp_name", "wandb_save_dir", "wandb_entity")),
    "mlflow_experiment": ("mlflow", ("mlflow_run_name", "mlflow_tracking_uri", "mlflow_tags", "mlflow_description")),
}


def check(cfg: Any) -> None:
    """A rank's check of its resolved config: no tracker field without the tracker, and every tracker importable."""
    for switch, (package, fields) in TRACKERS.items():
        on, stray = getattr(cfg.logger, switch), [name for name in fields if getattr(cfg.logger, name)]
        if stray and not on:
            raise UsageError(f"logger.{stray[0]} is set, but nothing is logged without logger.{switch}: set it too")
        if on and importlib.util.find_spec(package) is None:
            raise UsageError(f"logger.{switch} needs {package}, which {sys.executable} cannot import: {stack_fix()}")


def place(cfg: Any, run_dir: Path, given: set[str]) -> None:
    """Each tracker on is named after the run and writes into RUN_DIR, offline, unless the user chose otherwise."""
    logger, run_id = cfg.logger, run_dir.name
    if logger.wandb_project:
        logger.wandb_exp_name = logger.wandb_exp_name or run_id
        logger.wandb_save_dir = logger.wandb_save_dir or os.environ.get("WANDB_DIR") or str(run_dir)  # RUN_DIR/wandb
        cfg.env_vars.setdefault("WANDB_MODE", os.environ.get("WANDB_MODE", "offline"))
    if logger.mlflow_experiment:
        logger.mlflow_run_name = logger.mlflow_run_name or run_id  # Megatron Bridge refuses a run without a name
        cfg.env_vars.setdefault("MLFLOW_ALLOW_FILE_STORE", os.environ.get("MLFLOW_ALLOW_FILE_STORE", "true"))
        if not (logger.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")):
            logger.mlflow_tracking_uri = f"file:{run_dir}/mlruns"
            # not a copy of every checkpoint beside the checkpoints
            logger.mlflow_log_artifacts = "logger.mlflow_log_artifacts" in given and logger.mlflow_log_artifacts


def check_installed(python: str, overrides: list[str]) -> None:
    """The host's check where the ranks run its PYTHON (--local, --no-container): each tracker turned on imports."""
    logger = section(split(overrides), "logger")
    for switch, (package, _) in TRACKERS.items():
        probe = [python, "-c", f"import importlib.util as u, sys; sys.exit(u.find_spec({package!r}) is None)"]
        if logger.get(switch, "null") not in ("null", "", "''", '""') and subprocess.run(probe, check=False).returncode:
            raise UsageError(
                f"logger.{switch} needs {package}, which SRUNSH_PYTHON={q(python)} cannot import: install it with"
                f" PYTHON={q(python)} bash tools/install_python_stack.sh (versions.txt pins it)"
            )


def say_uploads(run_dir: str) -> None:
    """At a launch's end: what the trackers wrote offline into RUN_DIR, and the command that uploads or shows it."""
    wandb, mlruns = Path(run_dir, "wandb"), Path(run_dir, "mlruns")
    if any(wandb.glob("offline-run-*")):
        say(f"srun.sh: W&B logged offline; upload from a host with internet: wandb sync {q(str(wandb))}/offline-run-*")
    if mlruns.is_dir():  # MLflow has no command that uploads a file store to a server; its server reads one
        say(f"srun.sh: MLflow logged to {q(str(mlruns))}; view it: MLFLOW_ALLOW_FILE_STORE=true mlflow server"
            f" --backend-store-uri {q(f'file:{mlruns}')}")  # fmt: skip
