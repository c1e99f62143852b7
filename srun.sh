#!/usr/bin/env bash
# Start a Megatron Bridge recipe with one python process per GPU on every node of a SLURM allocation, inside the
# enroot image (pyxis), over EFA. SLURM starts every rank itself, so profilers see one plain process per GPU.
#
#   salloc -N 2 ./srun.sh recipes/deepseek_v2_lite_pretrain.py hf_path=/fsx/models/deepseek-ai/DeepSeek-V2-Lite
#   ./srun.sh --local recipes/tiny_gpt_pretrain.py train.train_iters=20     # this host only, no SLURM
#   ./srun.sh --dry-run recipes/llama3_8b_pretrain.py                       # print what would run
#   ./srun.sh --sbatch -N 4 -t 24:00:00 -- recipes/llama3_8b_pretrain.py    # a batch job that survives its time limit
#
# Usage: ./srun.sh [options] RECIPE.py [NAME=VALUE ...]     (NAME=VALUE reach every rank byte for byte)
#        ./srun.sh --sbatch [SBATCH_OPTION ...] -- [options] RECIPE.py [NAME=VALUE ...]
#   --nsys          run the ranks of profiling.profile_ranks under nsys; reports in RUN_DIR/nsys/
#   --dry-run       print the launch command and the environment; start nothing (works outside an allocation)
#   --no-container  the same launch without pyxis, with this host's $PYTHON (a venv every node shares)
#   --local         no SLURM: GPUS_PER_NODE ranks on this host
#   --sbatch ... -- submit the launch as a batch job with these sbatch options. RUN_ID is the job id. SAVE_LEAD_S
#                   before the time limit the ranks get SIGTERM, Megatron Bridge saves a checkpoint and stops, and
#                   the job requeues itself; a failed job is requeued up to MAX_RETRIES times; each time it
#                   resumes from its latest checkpoint. Its log: OUTPUT_ROOT/<recipe>/slurm-<job id>.out
#   -h, --help      this text
#
# Every rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, RUN_ID and RUN_DIR. Its
# output reaches the console labelled "RANK: " and RUN_DIR/logs/rank-RANK.log. entrypoint.py checks the recipe and
# every NAME=VALUE before distributed init. When a rank fails, the others get SIGTERM, and srun.sh names the rank
# that failed first and exits with its status. SIGINT or SIGTERM to srun.sh sends SIGTERM to every rank.
set -euo pipefail

REPO_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)

# ---- Knobs: environment variables, with their defaults -------------------------------------------------------
# Enroot image every rank runs in.                                  SQSH=/fsx/images/megatron.sqsh ./srun.sh ...
SQSH=${SQSH:-"$REPO_DIR/megatron-lm+latest.sqsh"}
# Container mounts SRC:DST[:FLAGS],...; they must hold this checkout, the recipe and OUTPUT_ROOT.
MOUNT=${MOUNT:-"$REPO_DIR:/workspace/megatron,/fsx:/fsx"}
# Ranks per node; empty: the allocation's GPUs a node (--gpus-per-node), else 8; with --local the visible GPUs.
GPUS_PER_NODE=${GPUS_PER_NODE:-}
# Run name; empty: a new run, <job id>-<date>-<time> (local-<date>-<time>-<pid> with --local). An earlier run's
# id resumes that run: same RUN_DIR, its latest checkpoint.                      RUN_ID=4242-20261130-101500 ...
RUN_ID=${RUN_ID:-}
# Where runs write: RUN_DIR=$OUTPUT_ROOT/<recipe>/$RUN_ID (config, logs, checkpoints, traces, nsys reports).
OUTPUT_ROOT=${OUTPUT_ROOT:-outputs}
# Rendezvous address; empty: the first node's address in SLURM (its NodeAddr), 127.0.0.1 with --local.
MASTER_ADDR=${MASTER_ADDR:-}
# Rendezvous port; empty: 20000-32767, derived from RUN_DIR, so two runs on one node differ.
MASTER_PORT=${MASTER_PORT:-}
# More srun arguments, split on whitespace (no quotes).             SRUN_EXTRA_ARGS="--mpi=pmix --time=2:00:00"
SRUN_EXTRA_ARGS=${SRUN_EXTRA_ARGS:-}
# Python for entrypoint.py: the image's, or this host's with --no-container / --local.  PYTHON=.venv/bin/python
PYTHON=${PYTHON:-python3}
# nsys for --nsys: the image's, or this host's with --no-container / --local.       NSYS=/opt/nsys/bin/nsys
NSYS=${NSYS:-nsys}
# --sbatch: seconds before the time limit at which the ranks save a checkpoint and stop.       SAVE_LEAD_S=600
SAVE_LEAD_S=${SAVE_LEAD_S:-300}
# --sbatch: how often a job whose ranks failed is requeued (a time-limit save always is).      MAX_RETRIES=0
MAX_RETRIES=${MAX_RETRIES:-2}
# ---- End of knobs ----------------------------------------------------------------------------------------------

# Seconds a rank has between SIGTERM and SIGKILL with --local (SLURM uses the cluster's KillWait).
readonly STOP_GRACE_S=30
readonly OPTIONS=(--nsys --dry-run --no-container --local -h --help --sbatch)

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

is_positive_int() {
  [[ $1 =~ ^[1-9][0-9]*$ ]]
}

parse_args() {
  USE_NSYS=0 DRY_RUN=0 USE_CONTAINER=1 LOCAL=0
  while (($#)); do
    case $1 in
      --nsys) USE_NSYS=1 ;;
      --dry-run) DRY_RUN=1 ;;
      --no-container) USE_CONTAINER=0 ;;
      --local) LOCAL=1 USE_CONTAINER=0 ;;
      -h | --help) usage && exit 0 ;;
      --sbatch) die "--sbatch comes first: ./srun.sh --sbatch [SBATCH_OPTION ...] -- [options] RECIPE.py ..." ;;
      -*) die "unknown option $(q "$1"): the options are ${OPTIONS[*]:0:4} --sbatch --help" ;;
      *) break ;;
    esac
    shift
  done
  (($#)) || die "no recipe given: usage is ./srun.sh [options] RECIPE.py [NAME=VALUE ...]"
  RECIPE=$1
  shift
  OVERRIDES=("$@")
  local arg option
  for arg in "${OVERRIDES[@]}"; do
    for option in "${OPTIONS[@]}"; do
      [[ $arg != "$option" ]] ||
        die "option $arg comes after the recipe: put it first, as in ./srun.sh $arg $(q "$RECIPE") ..."
    done
  done
  # nsys only records between cudaProfilerStart/Stop, which Megatron Bridge calls only with this switch on.
  ((!USE_NSYS)) || default_override profiling.use_nsys_profiler=true
  # A batch job's ranks save a checkpoint and stop on SIGTERM: Megatron Bridge's own handler, off by default. Its
  # data loader workers get the same SIGTERM and need the handler too, or their death fails the rank before it saves.
  if ((BATCH_JOB)); then
    default_override train.exit_signal_handler=true
    default_override train.exit_signal_handler_for_dataloader=true
  fi
}

# NAME=VALUE added to the overrides, unless the user set NAME.
default_override() {
  local arg
  for arg in "${OVERRIDES[@]}"; do
    [[ $arg != "${1%%=*}="* ]] || return 0
  done
  OVERRIDES+=("$1")
}

# GPUs a process here sees: CUDA_VISIBLE_DEVICES when set (even empty), else the NVIDIA device files.
visible_gpus() {
  local -a ids=()
  if [[ -v CUDA_VISIBLE_DEVICES ]]; then
    IFS=, read -ra ids <<<"$CUDA_VISIBLE_DEVICES"
    local id count=0
    for id in "${ids[@]}"; do
      [[ -n $id ]] && count=$((count + 1))
    done
    echo "$count"
  else
    { compgen -G '/dev/nvidia[0-9]*' || true; } | wc -l
  fi
}

# The number in SLURM's GPU counts ("4", "h100:4"); empty when unset.
gpu_count() {
  if [[ -n $1 ]]; then
    printf '%s\n' "${1##*:}"
  fi
}

# The fewest CPUs any node of the job has, from SLURM_JOB_CPUS_PER_NODE ("96(x2),48").
min_cpus_per_node() {
  local -a entries
  local entry cpus min=''
  IFS=, read -ra entries <<<"$1"
  for entry in "${entries[@]}"; do
    cpus=${entry%%(*}
    if [[ -z $min ]] || ((cpus < min)); then
      min=$cpus
    fi
  done
  printf '%s\n' "$min"
}

# Longest MOUNT entry whose source holds PATH: prints PATH's name inside the container, or fails.
container_path() {
  local path=$1 best_src='' best_dst='' entry src dst rest
  local -a entries
  IFS=, read -ra entries <<<"$MOUNT"
  for entry in "${entries[@]}"; do
    IFS=: read -r src dst rest <<<"$entry"
    src=$(realpath -m -- "$src")
    if [[ ($path == "$src" || $path == "$src"/* || $src == /) && ${#src} -gt ${#best_src} ]]; then
      best_src=$src best_dst=$dst
    fi
  done
  [[ -n $best_src ]] || return 1
  if [[ $best_src == / ]]; then
    printf '%s\n' "${best_dst%/}$path"
  else
    printf '%s\n' "$best_dst${path#"$best_src"}"
  fi
}

validate_mounts() {
  local -a entries
  local entry src dst rest
  IFS=, read -ra entries <<<"$MOUNT"
  for entry in "${entries[@]}"; do
    IFS=: read -r src dst rest <<<"$entry"
    if [[ -z $src || $dst != /* || $rest == *:* ]]; then
      die "MOUNT entry $(q "$entry") is not SRC:DST[:FLAGS] with an absolute DST:" \
        "fix MOUNT, e.g. MOUNT=$(q "$REPO_DIR:/workspace/megatron")"
    fi
    [[ -e $src ]] || die "MOUNT source $(q "$src") does not exist on this host: create it or drop it from MOUNT"
  done
}

# PATH's name in the container, or a one-line error naming WHAT could not be seen there.
in_container() {
  local what=$1 path=$2
  container_path "$path" ||
    die "$what $(q "$path") is outside every MOUNT source, so the ranks cannot see it:" \
      "add its directory to MOUNT (now $(q "$MOUNT"))"
}

validate_slurm_allocation() {
  if [[ -z ${SLURM_JOB_ID:-} ]]; then
    ((DRY_RUN)) || die "not inside a SLURM allocation: run under salloc/sbatch, or use --local / --dry-run"
    GPUS_PER_NODE=${GPUS_PER_NODE:-8}
    return 0
  fi
  [[ -z ${SLURM_HET_SIZE:-} ]] ||
    die "job $SLURM_JOB_ID is heterogeneous ($SLURM_HET_SIZE components), which srun.sh cannot place ranks in:" \
      "allocate one set of identical nodes"
  local allocated
  allocated=$(gpu_count "${SLURM_GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-}}")
  GPUS_PER_NODE=${GPUS_PER_NODE:-${allocated:-8}}
  is_positive_int "$GPUS_PER_NODE" || return 0 # reported by validate
  if [[ -n $allocated ]] && ((GPUS_PER_NODE > allocated)); then
    die "GPUS_PER_NODE=$GPUS_PER_NODE but job $SLURM_JOB_ID has $allocated GPU(s) a node:" \
      "set GPUS_PER_NODE=$allocated or allocate more (salloc --gpus-per-node=$GPUS_PER_NODE)"
  fi
  local cpus
  cpus=$(min_cpus_per_node "${SLURM_JOB_CPUS_PER_NODE:-}")
  if [[ -n $cpus ]] && ((cpus < GPUS_PER_NODE)); then
    die "job $SLURM_JOB_ID has $cpus CPU(s) on a node for $GPUS_PER_NODE ranks a node:" \
      "allocate whole nodes (salloc --exclusive) or at least --ntasks-per-node=$GPUS_PER_NODE"
  fi
  CPUS_PER_RANK=${cpus:+$((cpus / GPUS_PER_NODE))}
  command -v srun >/dev/null || ((DRY_RUN)) ||
    die "srun is not found on this host:" "run srun.sh where SLURM's client commands are"
}

validate() {
  [[ -f $RECIPE && -r $RECIPE ]] ||
    die "recipe $(q "$RECIPE") is not a readable file:" "check the path (relative to $(q "$PWD"))"
  CPUS_PER_RANK=''
  if ((SUBMITTING)); then
    GPUS_PER_NODE=${GPUS_PER_NODE:-8} # only for the checks here: the job takes its own from its allocation
  elif ((LOCAL)); then
    local visible
    visible=$(visible_gpus)
    ((visible > 0)) || [[ -n $GPUS_PER_NODE ]] ||
      die "--local found no GPU (CUDA_VISIBLE_DEVICES, /dev/nvidia*):" "run it on a GPU host or set CUDA_VISIBLE_DEVICES"
    GPUS_PER_NODE=${GPUS_PER_NODE:-$visible}
    if is_positive_int "$GPUS_PER_NODE" && ((GPUS_PER_NODE > visible)); then
      die "GPUS_PER_NODE=$GPUS_PER_NODE but this host shows $visible GPU(s):" \
        "lower GPUS_PER_NODE or widen CUDA_VISIBLE_DEVICES"
    fi
  else
    validate_slurm_allocation
  fi
  is_positive_int "$GPUS_PER_NODE" ||
    die "GPUS_PER_NODE=$(q "$GPUS_PER_NODE") is not a positive integer:" \
      "set it to the GPUs per node, e.g. GPUS_PER_NODE=8"
  if [[ -n $MASTER_PORT ]] && ! { is_positive_int "$MASTER_PORT" && ((MASTER_PORT <= 65535)); }; then
    die "MASTER_PORT=$(q "$MASTER_PORT") is not a port number:" "set 1-65535 or leave it unset"
  fi
  if [[ -n $RUN_ID && ! ($RUN_ID =~ ^[A-Za-z0-9_][A-Za-z0-9._-]*$) ]]; then
    die "RUN_ID=$(q "$RUN_ID") is not a run name:" "use letters, digits, '.', '_' and '-', as in 4242-20261130-101500"
  fi
  read -ra SRUN_EXTRA <<<"$SRUN_EXTRA_ARGS"

  local recipe_abs
  recipe_abs=$(realpath -- "$RECIPE")
  RUN_ROOT=$(realpath -m -- "$OUTPUT_ROOT")/$(basename -- "$RECIPE" .py)
  if ((USE_CONTAINER)); then
    [[ -f $SQSH ]] || die "image SQSH=$(q "$SQSH") does not exist:" "build it with 'make build' or point SQSH at one"
    validate_mounts
    # The ranks run this checkout's code, not the copy baked into the image, so recipe and code always match.
    CODE_DIR=$(in_container "this checkout" "$REPO_DIR")
    RECIPE_ARG=$(in_container "recipe" "$recipe_abs")
    RUN_ROOT_IN=$(in_container "OUTPUT_ROOT" "$RUN_ROOT")
    TASK_WORKDIR=$(container_path "$(pwd -P)") || TASK_WORKDIR=$CODE_DIR
  else
    command -v "$PYTHON" >/dev/null ||
      die "PYTHON=$(q "$PYTHON") is not found on this host:" "install it or set PYTHON=/path/to/python"
    if ((USE_NSYS)) && ! command -v "$NSYS" >/dev/null; then
      die "--nsys needs nsys, but NSYS=$(q "$NSYS") is not found:" "install Nsight Systems or set NSYS=/path/to/nsys"
    fi
    CODE_DIR=$REPO_DIR RECIPE_ARG=$RECIPE RUN_ROOT_IN=$RUN_ROOT
  fi
}

# An address of HOST that the other nodes reach: SLURM's NodeAddr, or the first of its IPv4 addresses outside
# 127.0.0.0/8 (Debian and Ubuntu map a host's own name to 127.0.1.1 in /etc/hosts, which only that host reaches).
node_address() {
  local host=$1 address
  address=$(scontrol show node --oneliner "$host" 2>/dev/null | sed -n 's/.* NodeAddr=\([^ ]*\).*/\1/p') || true
  address=${address:-$host}
  if [[ ! $address =~ ^[0-9]+(\.[0-9]+){3}$ ]]; then
    address=$(getent ahostsv4 "$address" | awk '$1 !~ /^127\./ { print $1; exit }') || true
  fi
  printf '%s\n' "$address"
}

new_run_id() {
  if ((LOCAL)); then
    printf 'local-%s-%s\n' "$(date +%Y%m%d-%H%M%S)" "$$"
  else
    printf '%s-%s\n' "${SLURM_JOB_ID:-JOBID}" "$(date +%Y%m%d-%H%M%S)"
  fi
}

# Job facts every rank shares: the run, the node list, WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
resolve_job() {
  RESUMING=0
  if [[ -n $RUN_ID ]]; then
    [[ -d $RUN_ROOT/$RUN_ID ]] && RESUMING=1
  else
    RUN_ID=$(new_run_id)
    [[ ! -e $RUN_ROOT/$RUN_ID ]] || RUN_ID+=-$$
  fi
  HOST_RUN_DIR=$RUN_ROOT/$RUN_ID # RUN_DIR as this host sees it; the ranks get theirs from export_rank_env
  LOCAL_WORLD_SIZE=$GPUS_PER_NODE
  if ((LOCAL)); then
    HOSTS=("$(uname -n)")
    MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
  elif [[ -n ${SLURM_JOB_NODELIST:-} ]]; then
    mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
    ((${#HOSTS[@]})) ||
      die "scontrol could not expand SLURM_JOB_NODELIST=$(q "$SLURM_JOB_NODELIST"):" "check the SLURM client setup"
    if [[ -z $MASTER_ADDR ]]; then
      MASTER_ADDR=$(node_address "${HOSTS[0]}")
      ((${#HOSTS[@]} == 1)) && MASTER_ADDR=${MASTER_ADDR:-${HOSTS[0]}}
      [[ -n $MASTER_ADDR ]] ||
        die "no address of ${HOSTS[0]} that other nodes reach (scontrol's NodeAddr, getent ahostsv4):" \
          "set MASTER_ADDR to its IP address"
    fi
  else
    HOSTS=(NODE1)
    MASTER_ADDR=${MASTER_ADDR:-NODE1}
  fi
  if [[ -z $MASTER_PORT ]]; then
    local checksum
    checksum=$(cksum <<<"$HOST_RUN_DIR")
    MASTER_PORT=$((20000 + ${checksum%% *} % 12768)) # below Linux's ephemeral range (32768+)
  fi
  WORLD_SIZE=$((${#HOSTS[@]} * GPUS_PER_NODE))
}

# What every rank inherits. Each variable stays for a reason (see README); a value the user already set wins.
# Left out on purpose, all obsolete with libfabric >= 1.18 and aws-ofi-nccl >= 1.7 (EFA installer >= 1.39 ships both):
# FI_PROVIDER=efa and FI_EFA_FORK_SAFE=1 (the plugin sets both), FI_EFA_USE_DEVICE_RDMA=1 (automatic on p4d/p5),
# NCCL_BUFFSIZE / NCCL_P2P_NET_CHUNKSIZE (the plugin applies AWS's tuned values per instance type),
# NCCL_NET_PLUGIN / NCCL_TUNER_PLUGIN / LD_LIBRARY_PATH (the image registers /opt/amazon/ofi-nccl with the loader and
# NCCL loads libnccl-net.so and its tuner from there; hard-coded paths break when the installer's layout moves),
# TORCH_DISTRIBUTED_BACKEND (read by nothing) and CUDA_DEVICE_MAX_CONNECTIONS (entrypoint.py decides per job).
export_rank_env() {
  export NCCL_DEBUG=${NCCL_DEBUG:-WARN}           # NCCL errors and warnings only; INFO shows the EFA/GIN setup
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}    # one process per GPU already: no CPU oversubscription
  export NCCL_GIN_TYPE=${NCCL_GIN_TYPE:-2}        # DeepEP's GIN via NCCL's proxy path (EFA's GDA mode needs NCCL 2.31+)
  export DEEP_EP_BACKEND=${DEEP_EP_BACKEND:-nccl} # DeepEP dispatch/combine over NCCL GIN, not NVSHMEM
  export MASTER_ADDR MASTER_PORT RUN_ID WORLD_SIZE LOCAL_WORLD_SIZE NSYS
  export RUN_DIR=$RUN_ROOT_IN/$RUN_ID # as the ranks see it
  export SRUN_SH_NSYS=$USE_NSYS       # entrypoint.py runs the profiled ranks under nsys
  ((!USE_CONTAINER)) || export SRUN_SH_IMAGE=$SQSH # named in entrypoint.py's error when the image lacks the stack
  unset RANK LOCAL_RANK               # --rank-exec takes them from SLURM (or from srun.sh with --local)
}

# The rank side (srun.sh --rank-exec) and batch jobs (--sbatch) live beside the launch, one file each.
# shellcheck source=launcher/rank.sh
source "$REPO_DIR/launcher/rank.sh"
# shellcheck source=launcher/sbatch.sh
source "$REPO_DIR/launcher/sbatch.sh"


print_dry_run() {
  echo "# srun.sh --dry-run: nothing was started. Each command below is one line you can paste into a shell."
  if ((!LOCAL)) && [[ -z ${SLURM_JOB_ID:-} ]]; then
    echo "# Not inside an allocation: job id JOBID and the first node NODE1 are placeholders."
  fi
  echo "# Environment srun.sh exports (every rank inherits it):"
  local name
  for name in NCCL_DEBUG OMP_NUM_THREADS NCCL_GIN_TYPE DEEP_EP_BACKEND MASTER_ADDR MASTER_PORT RUN_ID RUN_DIR \
    WORLD_SIZE LOCAL_WORLD_SIZE NSYS SRUN_SH_NSYS; do
    printf 'export %s=%q\n' "$name" "${!name}"
  done
  if ((LOCAL)); then
    echo "# Rank commands (srun.sh --local starts them together and stops them all when one fails):"
    local rank
    for ((rank = 0; rank < GPUS_PER_NODE; rank++)); do
      quoted env "RANK=$rank" "LOCAL_RANK=$rank" "${RANK_CMD[@]}"
    done
  else
    echo "# Launch command (run it inside the allocation):"
    quoted "${LAUNCH_CMD[@]}"
  fi
}

slurm_launch_command() {
  LAUNCH_CMD=(srun --nodes="${#HOSTS[@]}" --ntasks="$WORLD_SIZE" --ntasks-per-node="$GPUS_PER_NODE")
  # Explicit, so nothing inherited from the allocation or an enclosing step (-n1, --ntasks-per-node=1,
  # --cpus-per-task, cyclic placement) changes where the ranks go.
  [[ -z $CPUS_PER_RANK ]] || LAUNCH_CMD+=(--cpus-per-task="$CPUS_PER_RANK")
  LAUNCH_CMD+=(--distribution=block --mpi=none --kill-on-bad-exit=1 --job-name="srunsh-$RUN_ID")
  # Started from inside a job step (srun ... ./srun.sh, srun --pty bash): share that step's resources.
  [[ -z ${SLURM_STEP_ID:-} ]] || LAUNCH_CMD+=(--overlap)
  if ((USE_CONTAINER)); then
    # No --container-name: pyxis removes an unnamed container when the step ends, so none piles up on the nodes.
    LAUNCH_CMD+=(--container-image="$SQSH" --container-mounts="$MOUNT" --container-workdir="$TASK_WORKDIR")
  fi
  LAUNCH_CMD+=("${SRUN_EXTRA[@]}" "${RANK_CMD[@]}")
}

# srun's own per-task status lines; srun.sh reports the first failure itself.
drop_task_status() {
  trap '' INT TERM
  grep --line-buffered -v -E '^(srun: error: [^ ]+: tasks? [0-9,-]+: (Exited with exit code [0-9]+|Terminated|Killed)|slurmstepd(-[^:]+)?: error: \*\*\* STEP [0-9.]+ ON .* CANCELLED AT .*)$' || true
}

# SIGTERM to every rank, SIGKILL to what is left after the grace period. Runs as a trap: srun.sh then exits 128+N.
# shellcheck disable=SC2329  # invoked by the traps that trap_stop_signals sets
stop_launch() {
  [[ -z ${STOPPED_BY:-} ]] || return 0
  STOPPED_BY=$1
  echo "srun.sh: got SIG$1; sending SIGTERM to every rank" >&2
  if ((LOCAL)); then
    stop_local_ranks
    return
  fi
  local step grace
  step=$(launch_step)
  if [[ -z $step ]]; then
    [[ -z $LAUNCH_PID ]] || kill -TERM "$LAUNCH_PID" 2>/dev/null || true # no step yet: srun cancels its request
    return
  fi
  scancel --signal=TERM "$step" || true
  grace=$(scontrol show config 2>/dev/null | awk '$1 == "KillWait" { print $3 + 0 }') || true
  local deadline=$((SECONDS + ${grace:-30}))
  while kill -0 "$LAUNCH_PID" 2>/dev/null && ((SECONDS < deadline)); do
    sleep 0.2
  done
  scancel "$step" 2>/dev/null || true
}

# JOB.STEP of this launch's srun step; empty before it exists.
# shellcheck disable=SC2329  # invoked by the functions the traps run
launch_step() {
  squeue --noheader --steps --jobs="$SLURM_JOB_ID" --format='%i %j' 2>/dev/null |
    awk -v name="srunsh-$RUN_ID" '$2 == name { print $1; exit }' || true
}

stop_local_ranks() {
  local pid deadline=$((SECONDS + STOP_GRACE_S))
  ((${#RANK_PIDS[@]})) || return 0
  for pid in "${RANK_PIDS[@]}"; do
    kill -TERM -- "-$pid" 2>/dev/null || true
  done
  for pid in "${RANK_PIDS[@]}"; do
    while kill -0 -- "-$pid" 2>/dev/null && ((SECONDS < deadline)); do
      sleep 0.2
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
}

trap_stop_signals() {
  STOPPED_BY='' LAUNCH_PID='' RANK_PIDS=()
  local signal
  for signal in INT TERM HUP; do
    # shellcheck disable=SC2064  # the signal's name is fixed now, on purpose
    trap "stop_launch $signal" "$signal"
  done
  TIME_LIMIT_REACHED=0
  ((!BATCH_JOB)) || trap save_before_time_limit USR1
}

# A wait that outlives the signals srun.sh traps: returns the child's own status once it has ended.
wait_for() {
  local status
  while :; do
    status=0
    wait "$1" || status=$?
    kill -0 "$1" 2>/dev/null || return "$status"
  done
}

launch_slurm() {
  local err filter_pid status=0
  exec {err}> >(drop_task_status >&2)
  filter_pid=$!
  "${LAUNCH_CMD[@]}" 2>&"$err" &
  LAUNCH_PID=$!
  exec {err}>&-
  wait_for "$LAUNCH_PID" || status=$?
  wait "$filter_pid" || true
  return "$status"
}

# One process group a rank (setsid), so SIGTERM reaches everything the rank started. Not torchrun: on a failure it
# prints its own multi-line report into the stream that carries srun.sh's one-line errors, and exits 1 whatever the
# rank's status; srun.sh reports the first failure from the ranks' own records instead.
launch_local() {
  local rank status=0 left=$GPUS_PER_NODE
  for ((rank = 0; rank < GPUS_PER_NODE; rank++)); do
    RANK=$rank LOCAL_RANK=$rank setsid "${RANK_CMD[@]}" &
    RANK_PIDS+=("$!")
  done
  while ((left)) && [[ -z $STOPPED_BY ]]; do
    status=0
    wait -n || status=$?
    [[ -z $STOPPED_BY ]] || break
    left=$((left - 1))
    if ((status)); then
      stop_local_ranks
      break
    fi
  done
  wait
  return "$status"
}

# Which rank failed first, on which host, with which status, and the end of its log; or the one-line config error
# that every rank found. Ranks that the launcher stopped (SIGINT, SIGTERM, SIGKILL) sort after one that failed.
report_failure() {
  local logs=$HOST_RUN_DIR/logs file status when host stopped rank line
  if [[ -s $logs/usage-error ]]; then
    cat -- "$logs/usage-error" >&2
    FIRST_STATUS=2
    return 0
  fi
  line=$(for file in "$logs"/rank-*.status; do
    [[ -e $file ]] || continue
    read -r status when host <"$file"
    ((status)) || continue
    case $status in
      130 | 137 | 143) stopped=1 ;;
      *) stopped=0 ;;
    esac
    rank=${file##*/rank-}
    echo "$stopped $when ${rank%.status} $status $host"
  done | sort -k1,1n -k2,2g | head -n 1)
  [[ -n $line ]] || return 1
  read -r stopped when rank FIRST_STATUS host <<<"$line"
  echo "srun.sh: rank $rank on $host failed first, with exit status $FIRST_STATUS; the end of" \
    "$logs/rank-$rank.log:" >&2
  tail -n 20 -- "$logs/rank-$rank.log" | sed 's/^/    /' >&2
}

main() {
  BATCH_JOB=0 SUBMITTING=0
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
      RUN_ID=${RUN_ID:-${SLURM_JOB_ID:?--batch-job runs only as the batch script of srun.sh --sbatch}}
      ;;
  esac
  parse_args "$@"
  validate
  resolve_job
  export_rank_env
  local python_cmd=("$PYTHON" "$CODE_DIR/entrypoint.py" "$RECIPE_ARG" "${OVERRIDES[@]}")
  RANK_CMD=("$CODE_DIR/srun.sh" --rank-exec "${python_cmd[@]}")
  ((LOCAL)) || slurm_launch_command
  if ((DRY_RUN)); then
    print_dry_run
    exit 0
  fi

  (umask 077 && mkdir -p -- "$HOST_RUN_DIR/logs")
  rm -f -- "$HOST_RUN_DIR"/logs/rank-*.status "$HOST_RUN_DIR/logs/usage-error"
  local how="new run"
  ((RESUMING)) && how="resuming run"
  echo "# srun.sh: ${#HOSTS[@]} node(s) x $GPUS_PER_NODE rank(s), $how $RUN_ID in $HOST_RUN_DIR," \
    "master $MASTER_ADDR:$MASTER_PORT; each rank runs:" >&2
  quoted "${python_cmd[@]}" >&2

  trap_stop_signals
  local status=0
  if ((LOCAL)); then
    launch_local || status=$?
  else
    launch_slurm || status=$?
  fi
  if [[ -n $STOPPED_BY ]]; then
    exit $((128 + $(kill -l "$STOPPED_BY")))
  fi
  if ((status)) && report_failure; then
    status=$FIRST_STATUS
  fi
  ((!BATCH_JOB)) || requeue_batch_job "$status" || status=$?
  exit "$status"
}

main "$@"
