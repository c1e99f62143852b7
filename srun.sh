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
#   --health        only the health check, on every rank of the launch: per GPU, per node, between nodes in
#                   pairs, job-wide; a table on the console and in RUN_DIR/health.json naming every node to
#                   exclude; exit 0 when every node passes, 1 otherwise
#   --sbatch ... -- submit the launch as a batch job with these sbatch options. SRUNSH_RUN_ID is the job id.
#                   SRUNSH_SAVE_LEAD_S before the time limit the ranks get SIGTERM, Megatron Bridge saves a
#                   checkpoint and stops, and the job requeues itself; a failed job is requeued up to
#                   SRUNSH_MAX_RETRIES times; each time it resumes from its latest checkpoint. Its log:
#                   SRUNSH_OUTPUT_ROOT/<recipe>/slurm-<job id>.out
#   -h, --help      this text
#
# Each rank's output reaches the console labelled "RANK: " and RUN_DIR/logs/rank-RANK.log. When a rank fails, the
# others get SIGTERM, and srun.sh names the rank that failed first and exits with its status; with the override
# inprocess_restart.enabled=true, training restarts in every process instead (docs/failures.md). SIGINT or SIGTERM to
# srun.sh sends SIGTERM to every rank, after it wrote RUN_DIR/hang-report.txt: where every rank is (its Python stacks,
# torch's flight recorder), and which ranks are not in the collective the others wait in.
set -euo pipefail

REPO_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)

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
# Ranks per node; empty: the allocation's GPUs a node (--gpus-per-node), else 8; with --local the visible GPUs.
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
# ---- End of knobs ----------------------------------------------------------------------------------------------

usage() {
  sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$REPO_DIR/srun.sh"
  echo "Knobs (environment variables):"
  sed -n '/^# ---- Knobs/,/^# ---- End of knobs/{/^# ----/d;s/^# /  # /;s/^\([A-Z]\)/  \1/;p}' "$REPO_DIR/srun.sh"
}

# One line on stderr, exit 2: every problem srun.sh finds itself is reported this way, before anything starts.
die() {
  printf 'srun.sh: %s\n' "$*" >&2
  exit 2
}

# A value as the shell would need it typed, so messages stay on one line whatever the value holds.
q() {
  printf '%q' "$1"
}

# A command as one copy-pasteable line.
quoted() {
  local line
  printf -v line '%q ' "$@"
  printf '%s\n' "${line% }"
}

# The line that names the knobs from the environment, after PREFIX; and, on stderr, the old names it did not read.
say_environment_knobs() {
  [[ -z $ENV_KNOBS ]] || printf '%sknobs from the environment: %s\n' "$1" "$ENV_KNOBS"
  [[ -z $ENV_IGNORED ]] || echo "srun.sh: not read, since srun.sh's knobs have the SRUNSH_ prefix: $ENV_IGNORED" >&2
}

parse_args() {
  USE_NSYS=0 DRY_RUN=0 USE_CONTAINER=1 LOCAL=0 HEALTH_ONLY=0
  while (($#)); do
    case $1 in
      --nsys) USE_NSYS=1 ;;
      --dry-run) DRY_RUN=1 ;;
      --no-container) USE_CONTAINER=0 ;;
      --local) LOCAL=1 USE_CONTAINER=0 ;;
      --health) HEALTH_ONLY=1 ;;
      -h | --help) usage && exit 0 ;;
      --sbatch) die "--sbatch comes first: ./srun.sh --sbatch [SBATCH_OPTION ...] -- [options] RECIPE.py ..." ;;
      -*) die "unknown option $(q "$1"): the options are --nsys --dry-run --no-container --local --health --sbatch --help" ;;
      *) break ;;
    esac
    shift
  done
  # The checks on this host, all in one python3 (launcher/preflight.py): bad input is one line on stderr and exit 2,
  # before anything starts; otherwise it prints the launch's settings and paths, NUL-separated, in this order.
  command -v python3 >/dev/null ||
    die "python3 is not found on this host: srun.sh's checks, health check and hang report run it; install python3"
  local name settings=("${SBATCH_ARGS[@]/#/SBATCH_ARG=}") plan=()
  for name in "${!SRUNSH_@}" MASTER_PORT LOCAL USE_CONTAINER USE_NSYS DRY_RUN HEALTH_ONLY SUBMITTING BATCH_JOB; do
    settings+=("$name=${!name}")
  done
  mapfile -d '' -t plan < <(python3 "$REPO_DIR/launcher/preflight.py" "${settings[@]}" -- "$@")
  ((${#plan[@]} >= 11)) || exit 2 # preflight.py said why
  SRUNSH_GPUS_PER_NODE=${plan[0]} CPUS_PER_RANK=${plan[1]} SRUNSH_SQSH=${plan[2]} CONTAINER_MOUNTS=${plan[3]}
  CODE_DIR=${plan[4]} RECIPE_ARG=${plan[5]} RUN_ROOT=${plan[6]} RUN_ROOT_IN=${plan[7]} TASK_WORKDIR=${plan[8]}
  ENV_KNOBS=${plan[9]} ENV_IGNORED=${plan[10]}
  # The user's overrides, byte for byte, then those srun.sh adds: --nsys's switch, a batch job's SIGTERM handler.
  OVERRIDES=("${@:2}" "${plan[@]:11}")
  ((!HEALTH_ONLY)) || SRUNSH_HEALTH=1 OVERRIDES=()
  read -ra SRUN_EXTRA <<<"$SRUNSH_SRUN_EXTRA_ARGS"
}

# The parts of srun.sh, one file each: the rank side (--rank-exec), the launch's supervision (signals), batch jobs
# (--sbatch), the run directory (its id and lock), the health check, the hang report and the shared container.
for part in rank supervise sbatch run_dir health hang container; do
  # shellcheck source=/dev/null  # each part is linted on its own (make lint)
  source "$REPO_DIR/launcher/$part.sh"
done

# Job facts every rank shares: the run, the node list, WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
resolve_job() {
  name_run # launcher/run_dir.sh
  LOCAL_WORLD_SIZE=$SRUNSH_GPUS_PER_NODE
  if ((LOCAL)); then
    HOSTS=("$(uname -n)")
    MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
  elif [[ -n ${SLURM_JOB_NODELIST:-} ]]; then
    mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
    ((${#HOSTS[@]})) ||
      die "scontrol could not expand SLURM_JOB_NODELIST=$(q "$SLURM_JOB_NODELIST"):" "check the SLURM client setup"
    # The first node's address that the other nodes reach (its NodeAddr, its name, or its route to the second node)
    [[ -n $MASTER_ADDR ]] || MASTER_ADDR=$(python3 "$REPO_DIR/launcher/master_address.py" "${HOSTS[@]:0:2}") || exit $?
  else
    HOSTS=(NODE1)
    MASTER_ADDR=${MASTER_ADDR:-NODE1}
  fi
  ((DRY_RUN)) || claim_run_dir # launcher/run_dir.sh: the run's folder, taken, and its lock
  HOST_RUN_DIR=$RUN_ROOT/$SRUNSH_RUN_ID # RUN_DIR as this host sees it; the ranks get theirs from export_rank_env
  [[ -n $MASTER_PORT ]] || MASTER_PORT=$(run_port) # launcher/run_dir.sh
  WORLD_SIZE=$((${#HOSTS[@]} * SRUNSH_GPUS_PER_NODE))
  local IFS=,
  # shellcheck disable=SC2034  # NODE_LIST: read by the health check and the hang report
  NODE_LIST=${HOSTS[*]}
}

# What every rank inherits; a value the user already set wins. README's "Network environment" says why each EFA-era
# variable of the seed is left out (current libfabric and aws-ofi-nccl set or no longer need them), and
# CUDA_DEVICE_MAX_CONNECTIONS is entrypoint.py's to set, per job.
export_rank_env() {
  export NCCL_DEBUG=${NCCL_DEBUG:-WARN}           # NCCL errors and warnings only; INFO shows the EFA/GIN setup
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}    # one process per GPU already: no CPU oversubscription
  export NCCL_GIN_TYPE=${NCCL_GIN_TYPE:-2}        # DeepEP's GIN via the proxy path (5, EFA GDA: docs/network.md)
  export DEEP_EP_BACKEND=${DEEP_EP_BACKEND:-nccl} # DeepEP dispatch/combine over NCCL GIN, not NVSHMEM
  export MASTER_ADDR MASTER_PORT WORLD_SIZE LOCAL_WORLD_SIZE
  export RUN_ID=$SRUNSH_RUN_ID NSYS=$SRUNSH_NSYS # the ranks' names for them (launcher/outputs.py, launcher/nsys.py)
  export RUN_DIR=$RUN_ROOT_IN/$SRUNSH_RUN_ID # as the ranks see it
  export SRUN_SH_NSYS=$USE_NSYS       # entrypoint.py runs the profiled ranks under nsys
  unset SRUN_SH_IMAGE SRUN_SH_JOB_NAME SRUN_SH_MOUNT SRUN_SH_UNDER_NSYS # srun.sh's own below, never inherited
  ((!USE_CONTAINER)) || export SRUN_SH_IMAGE=$SRUNSH_SQSH # named in entrypoint.py's error when the image lacks it
  [[ -z ${SLURM_JOB_NAME:-} ]] || export SRUN_SH_JOB_NAME=$SLURM_JOB_NAME # launch.json's: the step gets its own name
  ((!USE_CONTAINER)) || export SRUN_SH_MOUNT=$CONTAINER_MOUNTS # named in entrypoint.py's error when a data path is outside it
  unset RANK LOCAL_RANK               # the rank takes them from SLURM or torchrun
}

# LAUNCH_CMD: one srun step that runs RANK_COMMAND in every rank, its geometry spelled out so that nothing inherited
# from the allocation or an enclosing step (-n1, --ntasks-per-node=1, --cpus-per-task, cyclic placement) changes where
# the ranks go; or, with --local, torchrun.
launch_command() {
  if ((LOCAL)); then
    LAUNCH_CMD=("$SRUNSH_PYTHON" -m torch.distributed.run --nnodes=1 --nproc-per-node="$SRUNSH_GPUS_PER_NODE"
      --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" --no-python "$@")
    return
  fi
  LAUNCH_CMD=(srun --nodes="${#HOSTS[@]}" --ntasks="$WORLD_SIZE" --ntasks-per-node="$SRUNSH_GPUS_PER_NODE")
  [[ -z $CPUS_PER_RANK ]] || LAUNCH_CMD+=(--cpus-per-task="$CPUS_PER_RANK")
  LAUNCH_CMD+=(--distribution=block --mpi=none --kill-on-bad-exit="$((!INPROCESS))" --job-name="srunsh-$SRUNSH_RUN_ID")
  # Started from inside a job step (srun ... ./srun.sh, srun --pty bash): share that step's resources.
  [[ -z ${SLURM_STEP_ID:-} ]] || LAUNCH_CMD+=(--overlap)
  if ((USE_CONTAINER)); then
    LAUNCH_CMD+=(--container-image="$SRUNSH_SQSH" --container-mounts="$CONTAINER_MOUNTS"
      --container-workdir="$TASK_WORKDIR")
    [[ -z $SRUNSH_CONTAINER_NAME ]] || LAUNCH_CMD+=(--container-name="$SRUNSH_CONTAINER_NAME")
  fi
  LAUNCH_CMD+=("${SRUN_EXTRA[@]}" "$@")
}

print_dry_run() {
  echo "# srun.sh --dry-run: nothing was started. Each command below is one line you can paste into a shell."
  if ((!LOCAL)) && [[ -z ${SLURM_JOB_ID:-} ]]; then
    echo "# Not inside an allocation: job id JOBID and the first node NODE1 are placeholders."
  fi
  say_environment_knobs "# "
  echo "# Environment srun.sh exports (every rank inherits it):"
  local name
  for name in NCCL_DEBUG OMP_NUM_THREADS NCCL_GIN_TYPE DEEP_EP_BACKEND MASTER_ADDR MASTER_PORT RUN_ID RUN_DIR \
    WORLD_SIZE LOCAL_WORLD_SIZE NSYS SRUN_SH_NSYS; do
    printf 'export %s=%q\n' "$name" "${!name}"
  done
  if ((SRUNSH_HEALTH && !HEALTH_ONLY)); then
    echo "# Health check, run first (SRUNSH_HEALTH=1):"
    quoted "${HEALTH_CMD[@]}"
  fi
  echo "# Launch command:"
  quoted "${LAUNCH_CMD[@]}"
}

main() {
  # shellcheck disable=SC2034  # SUBMITTING: read by parse_args, through its name
  BATCH_JOB=0 SUBMITTING=0 SBATCH_ARGS=() TIME_LIMIT_REACHED=0
  case ${1:-} in
    --rank-exec)
      shift
      exec_rank "$@"
      ;;
    --sbatch)
      shift
      submit_batch "$@"
      ;;
    --batch-job)
      shift
      BATCH_JOB=1
      trap_time_limit # launcher/sbatch.sh: from the start, or SLURM's USR1 would end this script
      SRUNSH_RUN_ID=${SRUNSH_RUN_ID:-${SLURM_JOB_ID:?--batch-job runs only as the batch script of srun.sh --sbatch}}
      ;;
  esac
  parse_args "$@"
  resolve_job
  # In-process restart (launcher/inprocess.py): whether it is on, and the header's line, which names the spare nodes.
  read -r INPROCESS INPROCESS_SAYS < <(python3 "$REPO_DIR/launcher/inprocess.py" --nodes "${#HOSTS[@]}" \
    --ranks-per-node "$SRUNSH_GPUS_PER_NODE" --master-port "$MASTER_PORT" -- "${OVERRIDES[@]}") || exit 2
  export_rank_env
  export SRUN_SH_INPROCESS=$INPROCESS
  ((!INPROCESS)) || export TORCH_CPP_LOG_LEVEL=${TORCH_CPP_LOG_LEVEL:-error} # NVRx's store polls warn every second
  local python_cmd=("$SRUNSH_PYTHON" "$CODE_DIR/entrypoint.py" "$RECIPE_ARG" "${OVERRIDES[@]}")
  ((!HEALTH_ONLY)) || python_cmd=("$SRUNSH_PYTHON" "$RECIPE_ARG") # launcher/health.py, as the ranks see it
  plan_container_start # launcher/container.sh: HEALTH=1's two steps share one container
  ((!SRUNSH_HEALTH)) || health_check_command
  launch_command "$CODE_DIR/srun.sh" --rank-exec "${python_cmd[@]}"
  if ((DRY_RUN)); then
    print_dry_run
    exit 0
  fi

  rm -f -- "$HOST_RUN_DIR"/logs/rank-*.status "$HOST_RUN_DIR/logs/usage-error"
  say_environment_knobs "# srun.sh: " >&2
  local how="new run"
  ((RESUMING)) && how="resuming run"
  echo "# srun.sh: ${#HOSTS[@]} node(s) x $SRUNSH_GPUS_PER_NODE rank(s), $how $SRUNSH_RUN_ID in $HOST_RUN_DIR," \
    "master $MASTER_ADDR:$MASTER_PORT; each rank runs:" >&2
  quoted "${python_cmd[@]}" >&2
  [[ -z $CONTAINER_START ]] || echo "# srun.sh: $CONTAINER_START" >&2
  [[ -z $INPROCESS_SAYS ]] || echo "# srun.sh: $INPROCESS_SAYS" >&2

  trap_stop_signals
  ((!SRUNSH_HEALTH)) || check_health # launcher/health.sh: returns only when every node passed
  local status=0
  # No training once a batch job's time limit is near (launcher/sbatch.sh); the watched launch (launcher/hang.sh).
  if time_left_to_train; then launch_watched "${LAUNCH_CMD[@]}" || status=$?; fi
  [[ -z $STOPPED_BY ]] || exit $((128 + $(kill -l "$STOPPED_BY")))
  if [[ -n ${HUNG:-} ]]; then
    status=124 # the hang watch stopped the ranks, and the hang report said why
  elif ((status && INPROCESS)) && python3 "$REPO_DIR/launcher/inprocess.py" --outcome "$HOST_RUN_DIR"; then
    status=0 # training completed on the ranks that replaced a failed one, which launcher/inprocess.py named
  elif ((status)) && report_failure; then
    status=$FIRST_STATUS
  fi
  ((!BATCH_JOB)) || requeue_batch_job "$status" ${HUNG:+"hung: see $HOST_RUN_DIR/hang-report.txt"} || status=$?
  exit "$status"
}

main "$@"
