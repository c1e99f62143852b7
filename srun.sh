#!/usr/bin/env bash
# Start a Megatron Bridge recipe with one python process per GPU on every node of a SLURM allocation, inside the
# enroot image (pyxis), over EFA. SLURM starts every rank itself, so profilers see one plain process per GPU.
#
#   salloc -N 2 ./srun.sh recipes/deepseek_v2_lite_pretrain.py hf_path=/fsx/models/deepseek-ai/DeepSeek-V2-Lite
#   ./srun.sh --local recipes/tiny_gpt_pretrain.py train.train_iters=20     # this host only, no SLURM
#   ./srun.sh --dry-run recipes/llama3_8b_pretrain.py                       # print what would run
#   ./srun.sh --sbatch -N 4 -t 24:00:00 -- recipes/llama3_8b_pretrain.py    # a batch job that survives its time limit
#   salloc -N 64 ./srun.sh --health                                         # check the nodes; exit 0 when all pass
#
# Usage: ./srun.sh [options] RECIPE.py [NAME=VALUE ...]     (NAME=VALUE reach every rank byte for byte)
#        ./srun.sh --sbatch [SBATCH_OPTION ...] -- [options] RECIPE.py [NAME=VALUE ...]
#        ./srun.sh --health [--local | --no-container | --dry-run]
#   --nsys          run the ranks of profiling.profile_ranks under nsys; reports in RUN_DIR/nsys/
#   --dry-run       print the launch command and the environment; start nothing (works outside an allocation)
#   --no-container  the same launch without pyxis, with this host's $SRUNSH_PYTHON (a venv every node shares)
#   --local         no SLURM: SRUNSH_GPUS_PER_NODE ranks on this host, started and supervised by torchrun
#   --health        only the health check, on every rank: per GPU, per node, between nodes in pairs, job-wide; a
#                   table on the console and in RUN_DIR/health.json names every node to exclude; exit 0 when all pass
#   --sbatch ... -- submit the launch as a batch job with these sbatch options; SRUNSH_RUN_ID is the job id. It saves
#                   as it trains, as often as a save's measured cost is worth (SRUNSH_MTBF_S); the ranks get
#                   SIGTERM SRUNSH_SAVE_LEAD_S before the time limit, Megatron Bridge saves a checkpoint and stops, and
#                   the job requeues itself, as a failed job does up to SRUNSH_MAX_RETRIES times, to resume from its
#                   newest checkpoint. Its log: SRUNSH_OUTPUT_ROOT/<recipe>/slurm-<job id>.out
#   -h, --help      this text
#
# Each rank's output goes to RUN_DIR/logs/rank-RANK.log; the console shows SRUNSH_CONSOLE_RANKS's lines labelled
# "RANK: ", and the other ranks' warnings and errors once. When a rank fails, the others get SIGTERM, and srun.sh names
# the rank that failed first and exits with its status; with inprocess_restart.enabled=true, training restarts in every
# process instead, from its newest checkpoint, local or persistent (docs/failures.md). SIGINT or SIGTERM to srun.sh
# sends SIGTERM to every rank, after it wrote RUN_DIR/hang-report.txt: where every rank is (its Python stacks, torch's
# flight recorder), and which ranks are not in the collective the others wait in.
#
# Trackers: TensorBoard in RUN_DIR/tb_logs; logger.wandb_project=NAME (W&B), logger.mlflow_experiment=NAME (MLflow) log
# offline into RUN_DIR unless WANDB_MODE or MLFLOW_TRACKING_URI say otherwise; the launch's end prints the command that
# uploads (wandb sync) or shows (mlflow server) it. Keys and tokens (WANDB_API_KEY, ...) go in the environment only.
set -euo pipefail

REPO_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)

# One rank (srun and torchrun start `srun.sh --rank-exec COMMAND...` in every task): launcher/rank/rank.sh.
[[ ${1:-} != --rank-exec ]] || exec bash "$REPO_DIR/launcher/rank/rank.sh" "${@:2}"

# ---- Knobs: environment variables, with their defaults -------------------------------------------------------
# srun.sh's own knobs start with SRUNSH_, so that no variable a host sets for another tool steers a launch;
# MASTER_ADDR and MASTER_PORT are torch's rendezvous names, meant the same way by every torch launcher.
# Enroot image every rank runs in.                            SRUNSH_SQSH=/fsx/images/megatron.sqsh ./srun.sh ...
SRUNSH_SQSH=${SRUNSH_SQSH:-"$REPO_DIR/megatron-lm+latest.sqsh"}
# Container mounts SRC:DST[:FLAGS],...; they must hold this checkout, the recipe and SRUNSH_OUTPUT_ROOT.
SRUNSH_MOUNT=${SRUNSH_MOUNT:-"$REPO_DIR:/workspace/megatron,/fsx:/fsx"}
# pyxis container name; empty: unnamed, unpacked at every launch and removed when it ends. A name reuses the
# container that an earlier launch left on each node (no unpack; docs/containers.md).   SRUNSH_CONTAINER_NAME=megatron
SRUNSH_CONTAINER_NAME=${SRUNSH_CONTAINER_NAME:-}
# Ranks per node; empty: the allocation's GPUs a node (--gpus-per-node, --gres=gpu:N), else 8; --local: visible GPUs.
SRUNSH_GPUS_PER_NODE=${SRUNSH_GPUS_PER_NODE:-}
# Run name; empty: a new run, <job id>-<date>-<time> (local-<date>-<time>-<pid> with --local). An earlier run's
# id resumes that run: same RUN_DIR, its latest checkpoint.               SRUNSH_RUN_ID=4242-20261130-101500 ...
SRUNSH_RUN_ID=${SRUNSH_RUN_ID:-}
# Where runs write: RUN_DIR=$SRUNSH_OUTPUT_ROOT/<recipe>/$SRUNSH_RUN_ID (config, logs, checkpoints, traces, nsys).
SRUNSH_OUTPUT_ROOT=${SRUNSH_OUTPUT_ROOT:-outputs}
# Rendezvous address; empty: the first node's address in SLURM (its NodeAddr), 127.0.0.1 with --local.
MASTER_ADDR=${MASTER_ADDR:-}
# Rendezvous port; empty: 20000-32767, derived from RUN_DIR, so two runs on one node differ.
MASTER_PORT=${MASTER_PORT:-}
# More srun arguments, split on whitespace (no quotes).       SRUNSH_SRUN_EXTRA_ARGS="--mpi=pmix --time=2:00:00"
SRUNSH_SRUN_EXTRA_ARGS=${SRUNSH_SRUN_EXTRA_ARGS:-}
# Python of the ranks and of --local's torchrun; this host's with --no-container/--local. SRUNSH_PYTHON=.venv/bin/python
SRUNSH_PYTHON=${SRUNSH_PYTHON:-python3}
# nsys for --nsys: the image's, or this host's with --no-container / --local.        SRUNSH_NSYS=/opt/nsys/bin/nsys
SRUNSH_NSYS=${SRUNSH_NSYS:-nsys}
# --sbatch: seconds before the time limit at which the ranks save a checkpoint and stop.   SRUNSH_SAVE_LEAD_S=600
SRUNSH_SAVE_LEAD_S=${SRUNSH_SAVE_LEAD_S:-300}
# --sbatch: how often a job whose ranks failed is requeued (a time-limit save always is).  SRUNSH_MAX_RETRIES=0
SRUNSH_MAX_RETRIES=${SRUNSH_MAX_RETRIES:-2}
# 1: the health check (--health) first; a batch job requeues itself without the nodes that fail it.
SRUNSH_HEALTH=${SRUNSH_HEALTH:-0}
# Seconds each part of the health check may take on a rank before it counts as a hang (the start: 3 x as long).
SRUNSH_HEALTH_TIMEOUT_S=${SRUNSH_HEALTH_TIMEOUT_S:-60}
# Seconds without a completed training step after which srun.sh writes the hang report and stops the ranks (exit
# 124); empty: 10 x the longest step so far, at least 5 min; off: never. Before the first step: 20 min, or more.
SRUNSH_HANG_TIMEOUT_S=${SRUNSH_HANG_TIMEOUT_S:-}
# Ranks whose every line the console shows (all: every rank's); empty: the first and the last. Of the others it shows
# each warning, error and traceback once, naming the ranks that printed it.   SRUNSH_CONSOLE_RANKS=0-3
SRUNSH_CONSOLE_RANKS=${SRUNSH_CONSOLE_RANKS:-}
# A directory on every node's own disk (not one the nodes share, where these caches race), mounted in the container,
# where each rank keeps its Triton and TorchInductor caches for the next launch on the node; off: the container's /tmp.
SRUNSH_COMPILE_CACHE=${SRUNSH_COMPILE_CACHE:-/var/tmp}
# A directory on every node's own disk (its NVMe) for local checkpoints (checkpoint.non_persistent_ckpt_type=local):
# a batch job or in-process restart saves there every few steps and reloads them in seconds (docs/failures.md); the
# container mounts it. Not on a file system the nodes share; off: none.
SRUNSH_LOCAL_CKPT_DIR=${SRUNSH_LOCAL_CKPT_DIR:-/var/tmp}
# Expected seconds between two faults of the job, from which the checkpoint intervals are chosen (docs/failures.md);
# empty: one fault per 5,696 node-hours (Llama 3's pretraining) over the job's nodes.          SRUNSH_MTBF_S=86400
SRUNSH_MTBF_S=${SRUNSH_MTBF_S:-}
# ---- End of knobs ----------------------------------------------------------------------------------------------

usage() {
  sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$REPO_DIR/srun.sh"
  echo "Knobs (environment variables):"
  sed -n '/^# ---- Knobs/,/^# ---- End of knobs/{/^# ----/d;s/^# /  # /;s/^\([A-Z]\)/  \1/;p}' "$REPO_DIR/srun.sh"
}

# --help among the leading options (after --sbatch's own options and --): the text, and nothing starts.
wants_help() {
  [[ ${1:-} != --sbatch ]] || while (($#)) && [[ $1 != -- ]]; do shift; done
  [[ ${1:-} != -- && ${1:-} != --sbatch ]] || shift
  while [[ ${1:-} =~ ^--(nsys|dry-run|no-container|local|health)$ ]]; do shift; done
  [[ ${1:-} == -h || ${1:-} == --help ]]
}

# What every rank inherits for EFA and NCCL; a value the user set wins (docs/network.md says why each stays).
# CUDA_DEVICE_MAX_CONNECTIONS is entrypoint.py's to set, per job, and OMP_NUM_THREADS launcher/host/command.py's.
export_network_env() {
  export NCCL_DEBUG=${NCCL_DEBUG:-WARN}           # NCCL errors and warnings only; INFO shows the EFA/GIN setup
  export NCCL_GIN_TYPE=${NCCL_GIN_TYPE:-2}        # DeepEP's GIN via the proxy path (5, EFA GDA: docs/network.md)
  export DEEP_EP_BACKEND=${DEEP_EP_BACKEND:-nccl} # DeepEP dispatch/combine over NCCL GIN, not NVSHMEM
}

# The knobs as NAME=VALUE (defaults applied), -- and srun.sh's own arguments, to the launch's one supervisor on this
# host (launcher/host/supervisor.py): checks, srun or torchrun, signals, hang watch, health check, report, requeue.
main() {
  if wants_help "$@"; then
    usage
    exit 0
  fi
  command -v python3 >/dev/null || {
    echo "srun.sh: python3 is not found on this host: srun.sh's checks, health check and hang report run it;" \
      "install python3" >&2
    exit 2
  }
  local name knobs=()
  for name in "${!SRUNSH_@}" MASTER_ADDR MASTER_PORT; do
    knobs+=("$name=${!name}")
  done
  export_network_env
  exec python3 "$REPO_DIR/launcher/host/supervisor.py" "${knobs[@]}" -- "$@"
}

main "$@"
