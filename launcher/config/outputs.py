"""Where a run writes: $OUTPUT_ROOT/<recipe>/<RUN_ID>/, its record and its outputs (docs/launch.md, "In the code")."""

import json
import os
import re
import sys
from importlib import metadata
from pathlib import Path

from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.utils import omegaconf_utils
from omegaconf import OmegaConf

from launcher.run_files import write_private

# The variables launch.json records, by exact name: a family prefix would record credentials (docs/launch.md).
RECORDED_ENV_NAMES = frozenset(
    # the job and this rank's place in it
    "RUN_ID RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT SRUNSH_GPUS_PER_NODE SLURM_JOB_ID"
    " SLURM_JOB_NAME SLURM_JOB_PARTITION SLURM_CLUSTER_NAME SLURM_JOB_NODELIST SLURM_NNODES SLURM_NTASKS"
    " SLURM_NTASKS_PER_NODE SLURM_STEP_ID SLURM_GPUS_PER_NODE SLURM_GPUS_ON_NODE SLURM_JOB_CPUS_PER_NODE"
    " SLURM_RESTART_COUNT"
    # CUDA, PyTorch, threads
    " CUDA_VISIBLE_DEVICES CUDA_DEVICE_MAX_CONNECTIONS CUDA_LAUNCH_BLOCKING PYTORCH_CUDA_ALLOC_CONF"
    " TORCH_NCCL_HIGH_PRIORITY TORCH_NCCL_ASYNC_ERROR_HANDLING TORCH_NCCL_BLOCKING_WAIT TORCH_DISTRIBUTED_DEBUG"
    " OMP_NUM_THREADS"
    # NCCL, its plugins, EFA
    " NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_SOCKET_IFNAME NCCL_IB_HCA NCCL_NET NCCL_NET_PLUGIN NCCL_TUNER_PLUGIN"
    " NCCL_GIN_TYPE NCCL_PROTO NCCL_ALGO NCCL_BUFFSIZE NCCL_MIN_CTAS NCCL_MAX_CTAS NCCL_P2P_NET_CHUNKSIZE"
    " NCCL_NVLS_ENABLE NCCL_CROSS_NIC NCCL_NET_GDR_LEVEL NCCL_P2P_LEVEL NCCL_CUMEM_ENABLE GLOO_SOCKET_IFNAME"
    " FI_PROVIDER FI_EFA_USE_DEVICE_RDMA FI_EFA_FORK_SAFE FI_EFA_USE_HUGE_PAGE"
    # Transformer Engine, DeepEP, Hugging Face
    " NVTE_NORM_FWD_USE_CUDNN NVTE_NORM_BWD_USE_CUDNN NVTE_FUSED_ATTN NVTE_FLASH_ATTN NVTE_UNFUSED_ATTN"
    " NVTE_ALLOW_NONDETERMINISTIC_ALGO NVTE_DEBUG NVTE_DEBUG_LEVEL DEEP_EP_BACKEND HF_HOME HF_HUB_CACHE"
    " HF_HUB_OFFLINE HF_DATASETS_OFFLINE HF_ENDPOINT TRANSFORMERS_OFFLINE".split()
)
# Inside a URL, the user:password@ part and the query (signed URLs carry their token there).
URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s]*@")
URL_QUERY = re.compile(r"(?P<before>\b[A-Za-z][A-Za-z0-9+.-]*://[^?#\s]*\?)[^#\s]*")
PACKAGES = ("torch", "megatron-core", "megatron-bridge", "transformer-engine", "viztracer")
# Megatron Bridge 0.6 recipes default to <cwd>/nemo_experiments/default/..., shared by every run started there.
UPSTREAM_DEFAULT = Path.cwd() / "nemo_experiments" / "default"


def run_dir(recipe: Path) -> Path:
    """srun.sh's RUN_DIR; else OUTPUT_ROOT/<recipe>/<RUN_ID, the SLURM job id or the pid>."""
    if "RUN_DIR" in os.environ:
        return Path(os.environ["RUN_DIR"]).absolute()
    run_id = os.environ.get("RUN_ID") or os.environ.get("SLURM_JOB_ID") or f"pid{os.getpid()}"
    return Path(os.environ.get("OUTPUT_ROOT", "outputs")).absolute() / recipe.stem / run_id


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


def without_url_credentials(text: str) -> str:
    """text with the credentials of every URL in it replaced: https://REDACTED@host/path?REDACTED."""
    return URL_QUERY.sub(r"\g<before>REDACTED", URL_USERINFO.sub(r"\g<scheme>REDACTED@", text))


def save_run_record(cfg: ConfigContainer, directory: Path) -> None:
    """config.yaml and launch.json, to reproduce the run, without URL credentials and for their owner only."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    directory.mkdir(mode=0o700, exist_ok=True)
    write_private(directory / "config.yaml", without_url_credentials(config_yaml(cfg)))
    environment = dict(os.environ)
    if "SRUNSH_JOB_NAME" in environment:  # inside srun.sh's step, SLURM_JOB_NAME is the step's name
        environment["SLURM_JOB_NAME"] = environment["SRUNSH_JOB_NAME"]
    recorded = sorted((name, value) for name, value in environment.items() if name in RECORDED_ENV_NAMES)
    record = {
        "argv": [without_url_credentials(argument) for argument in sys.argv],
        "environment": {name: without_url_credentials(value) for name, value in recorded},
        "versions": {name: metadata.version(name) for name in PACKAGES},
    }
    write_private(directory / "launch.json", json.dumps(record, indent=2) + "\n")
