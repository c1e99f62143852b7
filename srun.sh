#!/usr/bin/env bash
# Start a Megatron Bridge recipe with one process per GPU on every node of a SLURM allocation, inside the enroot
# image (pyxis), over EFA. No torchrun: SLURM starts every rank, so profilers see one plain process per GPU.
#
#   salloc -N 2 ./srun.sh recipes/deepseek_v2_lite_pretrain.py hf_path=/fsx/models/deepseek-ai/DeepSeek-V2-Lite
#   ./srun.sh --local recipes/deepseek_v2_lite_pretrain.py train.train_iters=20     # this host only, no SLURM
#   ./srun.sh --dry-run recipes/deepseek_v2_lite_pretrain.py                        # print what would run
#
# ./srun.sh --help lists every option and knob.
set -euo pipefail

REPO_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)

# ---- Knobs: environment variables, with their defaults ---------------------------------------------------------
# Enroot image every rank runs in.                                 SQSH=/fsx/images/megatron.sqsh ./srun.sh ...
SQSH=${SQSH:-"$REPO_DIR/megatron-lm+latest.sqsh"}
# Container mounts SRC:DST[:FLAGS],...; every SRC must exist here.  MOUNT=$PWD:/workspace/megatron,/data:/data
MOUNT=${MOUNT:-"$REPO_DIR:/workspace/megatron,/fsx:/fsx"}
# Where MOUNT puts this repository inside the container.           CONTAINER_WORKDIR=/opt/megatron
CONTAINER_WORKDIR=${CONTAINER_WORKDIR:-/workspace/megatron}
# Ranks per node; empty: 8, or with --local the visible GPUs.       GPUS_PER_NODE=4 ./srun.sh --local ...
GPUS_PER_NODE=${GPUS_PER_NODE:-}
# Rendezvous port; empty: 20000 + SLURM_JOB_ID % 20000, so two jobs on one node differ (29500 with --local).
MASTER_PORT=${MASTER_PORT:-}
# srun's MPI plugin (`srun --mpi=list` shows what your SLURM has). SRUN_MPI=pmi2 ./srun.sh ...
SRUN_MPI=${SRUN_MPI:-pmix}
# More srun arguments, split on whitespace (no quotes), every srun. SRUN_EXTRA_ARGS="--exclusive -t 2:00:00"
SRUN_EXTRA_ARGS=${SRUN_EXTRA_ARGS:-}
# Python for entrypoint.py: the image's, or this host's with --no-container / --local.  PYTHON=.venv/bin/python
PYTHON=${PYTHON:-python3}
# nsys for --nsys: the image's, or this host's with --no-container / --local.     NSYS=/opt/nsys/bin/nsys
NSYS=${NSYS:-nsys}
# Where --nsys writes reports, relative to the ranks' working directory.       NSYS_OUTPUT_DIR=/fsx/profiles
NSYS_OUTPUT_DIR=${NSYS_OUTPUT_DIR:-nsys-megatron}

# Seconds --local gives the other ranks between SIGTERM and SIGKILL when one rank fails or srun.sh is stopped.
readonly STOP_GRACE_S=10
# nsys settings for --nsys: the capture window is the recipe's profiling.profile_step_start/end, which Megatron
# Bridge marks with cudaProfilerStart/Stop; efa_metrics samples the EFA counters into the same timeline.
readonly NSYS_PROFILE_ARGS=(profile -t "cuda,nvtx" -s none --cpuctxsw=none --capture-range=cudaProfilerApi
  --capture-range-end=stop --enable efa_metrics --force-overwrite=true)
readonly OPTIONS=(--nsys --dry-run --no-container --local -h --help)

usage() {
  cat <<EOF
Usage: ./srun.sh [options] RECIPE.py [NAME=VALUE ...]

Runs "\$PYTHON entrypoint.py RECIPE.py [NAME=VALUE ...]" once per GPU on every node of the current SLURM
allocation (salloc/sbatch), inside the enroot image \$SQSH. NAME=VALUE arguments reach every rank byte for byte.
Before anything starts, "entrypoint.py --check" validates the recipe and overrides on this host (in the image).

Options (before RECIPE.py only):
  --nsys          profile the ranks in profiling.profile_ranks (default [0]) with nsys; one report per job, host
                  and rank in \$NSYS_OUTPUT_DIR/<job>/; adds profiling.use_nsys_profiler=true unless given
  --dry-run       print the srun (or local) command, the environment and each rank's command; start nothing.
                  Works outside an allocation (job id and nodes are then placeholders). Validates options and
                  knobs; runs the entrypoint check only when it runs on this host (--no-container, --local)
  --no-container  same launch without pyxis, with this host's \$PYTHON (a venv shared by every node)
  --local         no SLURM: start GPUS_PER_NODE ranks on this host (MASTER_ADDR=127.0.0.1); when one rank
                  fails, or srun.sh gets SIGINT/SIGTERM, the others are stopped
  -h, --help      show this help

Knobs (environment variables; current value in brackets):
  SQSH              enroot image, built by 'make build' [$SQSH]
  MOUNT             container mounts SRC:DST[:FLAGS],...; every SRC must exist on this host [$MOUNT]
  CONTAINER_WORKDIR where MOUNT puts this repository in the container [$CONTAINER_WORKDIR]. Ranks start in the
                    container path of the current directory when a mount covers it, else here; the recipe path
                    is translated through MOUNT the same way
  GPUS_PER_NODE     ranks per node [${GPUS_PER_NODE:-8; with --local the visible GPUs}]
  MASTER_PORT       rendezvous port [${MASTER_PORT:-20000 + SLURM_JOB_ID % 20000; 29500 with --local}]
  SRUN_MPI          srun --mpi plugin, see 'srun --mpi=list' [$SRUN_MPI]
  SRUN_EXTRA_ARGS   more srun arguments, split on whitespace, e.g. "--exclusive --time=2:00:00" [$SRUN_EXTRA_ARGS]
  PYTHON            python that runs entrypoint.py: the image's, or this host's with --no-container/--local [$PYTHON]
  NSYS              nsys binary for --nsys: the image's, or this host's with --no-container/--local [$NSYS]
  NSYS_OUTPUT_DIR   report directory for --nsys, relative to the ranks' working directory [$NSYS_OUTPUT_DIR]

A failing rank ends the whole job (srun --kill-on-bad-exit=1; --local stops the others). The allocation must let
GPUS_PER_NODE tasks run on each node: allocate whole nodes (salloc --exclusive) where nodes are shared.
Every rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, RUN_ID (the SLURM job id,
or local-<date>-<pid>), plus NCCL_DEBUG, OMP_NUM_THREADS, NCCL_GIN_TYPE, DEEP_EP_BACKEND, TRITON_CACHE_DIR and
TORCH_EXTENSIONS_DIR unless already set. srun.sh never sets CUDA_DEVICE_MAX_CONNECTIONS: entrypoint.py does.
EOF
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

is_option() {
  local option
  for option in "${OPTIONS[@]}"; do
    [[ $1 == "$option" ]] && return 0
  done
  return 1
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
      -*) die "unknown option $(q "$1"): the options are --nsys --dry-run --no-container --local --help" ;;
      *) break ;;
    esac
    shift
  done
  (($#)) || die "no recipe given: usage is ./srun.sh [options] RECIPE.py [NAME=VALUE ...]"
  RECIPE=$1
  shift
  OVERRIDES=("$@")
  local arg nsys_switch_given=0
  for arg in "${OVERRIDES[@]}"; do
    if is_option "$arg"; then
      die "option $arg comes after the recipe: put it first, as in ./srun.sh $arg $(q "$RECIPE") ..."
    fi
    [[ $arg == profiling.use_nsys_profiler=* ]] && nsys_switch_given=1
  done
  # nsys only records between cudaProfilerStart/Stop, which Megatron Bridge calls only with this switch on.
  if ((USE_NSYS && !nsys_switch_given)); then
    OVERRIDES+=(profiling.use_nsys_profiler=true)
  fi
}

# GPUs this host shows: CUDA_VISIBLE_DEVICES when set (even empty), else nvidia-smi's list.
visible_gpus() {
  if [[ -v CUDA_VISIBLE_DEVICES ]]; then
    local -a ids
    IFS=, read -ra ids <<<"$CUDA_VISIBLE_DEVICES"
    local id count=0
    for id in "${ids[@]}"; do
      [[ -n $id ]] && count=$((count + 1))
    done
    echo "$count"
  elif command -v nvidia-smi >/dev/null; then
    nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true
  else
    echo 0
  fi
}

# Longest MOUNT entry whose source holds PATH: prints PATH's name inside the container, or fails.
container_path() {
  local path=$1 best_src='' best_dst='' entry src dst rest
  local -a entries
  IFS=, read -ra entries <<<"$MOUNT"
  for entry in "${entries[@]}"; do
    IFS=: read -r src dst rest <<<"$entry"
    src=$(realpath -- "$src")
    if [[ ($path == "$src" || $path == "$src"/* || $src == / ) && ${#src} -gt ${#best_src} ]]; then
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
        "fix MOUNT, e.g. MOUNT=$(q "$REPO_DIR:$CONTAINER_WORKDIR")"
    fi
    [[ -e $src ]] || die "MOUNT source $(q "$src") does not exist on this host: create it or drop it from MOUNT"
  done
}

validate() {
  [[ -f $RECIPE && -r $RECIPE ]] ||
    die "recipe $(q "$RECIPE") is not a readable file:" "check the path (relative to $(q "$PWD"))"
  if ((!LOCAL && !DRY_RUN)) && [[ -z ${SLURM_JOB_ID:-} ]]; then
    die "not inside a SLURM allocation: run under salloc/sbatch, or use --local / --dry-run"
  fi

  local visible=0
  if ((LOCAL)); then
    visible=$(visible_gpus)
    if [[ -z $GPUS_PER_NODE ]]; then
      ((visible > 0)) || die "--local found no GPU (CUDA_VISIBLE_DEVICES, nvidia-smi -L):" \
        "run it on a GPU host or set CUDA_VISIBLE_DEVICES"
      GPUS_PER_NODE=$visible
    fi
  fi
  GPUS_PER_NODE=${GPUS_PER_NODE:-8}
  is_positive_int "$GPUS_PER_NODE" ||
    die "GPUS_PER_NODE=$(q "$GPUS_PER_NODE") is not a positive integer:" \
      "set it to the GPUs per node, e.g. GPUS_PER_NODE=8"
  if ((LOCAL && GPUS_PER_NODE > visible)); then
    die "GPUS_PER_NODE=$GPUS_PER_NODE but this host shows $visible GPU(s):" \
      "lower GPUS_PER_NODE or widen CUDA_VISIBLE_DEVICES"
  fi
  if [[ -n $MASTER_PORT ]] && ! { is_positive_int "$MASTER_PORT" && ((MASTER_PORT <= 65535)); }; then
    die "MASTER_PORT=$(q "$MASTER_PORT") is not a port number:" "set 1-65535 or leave it unset"
  fi
  [[ $SRUN_MPI =~ ^[A-Za-z0-9_]+$ ]] ||
    die "SRUN_MPI=$(q "$SRUN_MPI") is not an MPI plugin name:" "pick one that 'srun --mpi=list' shows"
  read -ra SRUN_EXTRA <<<"$SRUN_EXTRA_ARGS"

  if ((USE_CONTAINER)); then
    [[ -f $SQSH ]] || die "image SQSH=$(q "$SQSH") does not exist:" "build it with 'make build' or point SQSH at one"
    validate_mounts
    local recipe_abs
    recipe_abs=$(realpath -- "$RECIPE")
    RECIPE_ARG=$(container_path "$recipe_abs") ||
      die "recipe $(q "$RECIPE") is outside every MOUNT source, so the container cannot read it:" \
        "move it under $(q "$REPO_DIR") or add its directory to MOUNT"
    TASK_WORKDIR=$(container_path "$(pwd -P)") || TASK_WORKDIR=$CONTAINER_WORKDIR
    ENTRYPOINT=$CONTAINER_WORKDIR/entrypoint.py
    SELF=$CONTAINER_WORKDIR/srun.sh
  else
    command -v "$PYTHON" >/dev/null ||
      die "PYTHON=$(q "$PYTHON") is not found on this host:" "install it or set PYTHON=/path/to/python"
    if ((USE_NSYS)) && ! command -v "$NSYS" >/dev/null; then
      die "--nsys needs nsys, but NSYS=$(q "$NSYS") is not found:" "install Nsight Systems or set NSYS=/path/to/nsys"
    fi
    RECIPE_ARG=$RECIPE
    ENTRYPOINT=$REPO_DIR/entrypoint.py
    SELF=$REPO_DIR/srun.sh
  fi
  if ((!LOCAL && !DRY_RUN)); then
    command -v srun >/dev/null || die "srun is not found on this host:" "run srun.sh where SLURM's client commands are"
  fi
}

# Job facts every rank shares: RUN_ID, the node list, WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
resolve_master() {
  LOCAL_WORLD_SIZE=$GPUS_PER_NODE
  if ((LOCAL)); then
    RUN_ID=local-$(date +%Y%m%d-%H%M%S)-$$
    NODES=1
    HOSTS=("$(uname -n)")
    MASTER_ADDR=127.0.0.1
    MASTER_PORT=${MASTER_PORT:-29500}
  else
    RUN_ID=${SLURM_JOB_ID:-JOBID}
    NODES=${SLURM_JOB_NUM_NODES:-1}
    if [[ -n ${SLURM_JOB_NODELIST:-} ]]; then
      mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
      ((${#HOSTS[@]})) ||
        die "scontrol could not expand SLURM_JOB_NODELIST=$(q "$SLURM_JOB_NODELIST"):" "check the SLURM client setup"
    else
      HOSTS=("$(uname -n)")
    fi
    # IPv4 on purpose: `getent hosts` may answer with an IPv6 address first. A name that getent cannot resolve is
    # passed on as is; torch then resolves it on every node (and fails there with the name in the message).
    MASTER_ADDR=$(getent ahostsv4 "${HOSTS[0]}" | awk 'NR == 1 { print $1 }') || true
    MASTER_ADDR=${MASTER_ADDR:-${HOSTS[0]}}
    if [[ -z $MASTER_PORT && ${SLURM_JOB_ID:-} =~ ^[0-9]+$ ]]; then
      MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))
    fi
    MASTER_PORT=${MASTER_PORT:-29500}
  fi
  WORLD_SIZE=$((NODES * GPUS_PER_NODE))
}

# What every rank inherits. Each variable stays for a reason (see README); a value the user already set wins.
# Left out on purpose, all obsolete with libfabric >= 1.18 and aws-ofi-nccl >= 1.7 (EFA installer >= 1.39 ships both):
# FI_PROVIDER=efa and FI_EFA_FORK_SAFE=1 (the plugin sets both), FI_EFA_USE_DEVICE_RDMA=1 (automatic on p4d/p5),
# NCCL_BUFFSIZE / NCCL_P2P_NET_CHUNKSIZE (the plugin applies AWS's tuned values per instance type),
# NCCL_NET_PLUGIN / NCCL_TUNER_PLUGIN / LD_LIBRARY_PATH (the image registers /opt/amazon/ofi-nccl with the loader and
# NCCL loads libnccl-net.so and its tuner from there; hard-coded paths break when the installer's layout moves),
# TORCH_DISTRIBUTED_BACKEND (read by nothing) and CUDA_DEVICE_MAX_CONNECTIONS (entrypoint.py decides per job).
export_network_env() {
  export NCCL_DEBUG=${NCCL_DEBUG:-WARN}           # NCCL errors and warnings only; INFO shows the EFA/GIN setup
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}    # one process per GPU already: no CPU oversubscription
  export NCCL_GIN_TYPE=${NCCL_GIN_TYPE:-2}        # DeepEP's GIN via NCCL's proxy path (EFA's GDA mode needs NCCL 2.31+)
  export DEEP_EP_BACKEND=${DEEP_EP_BACKEND:-nccl} # DeepEP dispatch/combine over NCCL GIN, not NVSHMEM
  export MASTER_ADDR MASTER_PORT RUN_ID WORLD_SIZE LOCAL_WORLD_SIZE
  export NSYS NSYS_OUTPUT_DIR SRUN_SH_PROFILE_RANKS=''
}

# Validates the recipe and overrides before any rank starts, and learns which ranks --nsys wraps.
preflight() {
  local -a check=("$PYTHON" "$ENTRYPOINT" --check --world-size "$WORLD_SIZE" "$RECIPE_ARG" "${OVERRIDES[@]}")
  if ((USE_CONTAINER)); then
    if ((DRY_RUN)); then
      SRUN_SH_PROFILE_RANKS=0
      PREFLIGHT_NOTE="entrypoint check not run (it needs the image); --nsys assumes profile_ranks=0"
      return
    fi
    check=(srun --nodes=1 --ntasks=1 "${CONTAINER_ARGS[@]}" "${SRUN_EXTRA[@]}" "${check[@]}")
  fi
  local out status=0
  out=$("${check[@]}") || status=$?
  # A failed check has printed its one-line error already: hand its status on and start nothing.
  ((status == 0)) || exit "$status"
  local last=${out##*$'\n'}
  [[ $last == profile_ranks=* ]] ||
    die "entrypoint.py --check did not end its output with profile_ranks=...: is entrypoint.py from this checkout?"
  SRUN_SH_PROFILE_RANKS=${last#profile_ranks=}
  [[ $SRUN_SH_PROFILE_RANKS =~ ^([0-9]+(,[0-9]+)*)?$ ]] ||
    die "entrypoint.py --check printed $(q "$last"), not profile_ranks=R[,R...]: is entrypoint.py from this checkout?"
  if [[ $out == *$'\n'* ]]; then
    printf '%s\n' "${out%$'\n'*}" >&2 # the check's other output: diagnostics, kept off the job's stdout
  fi
  ((USE_NSYS)) || SRUN_SH_PROFILE_RANKS=''
}

is_profiled() {
  [[ ,$SRUN_SH_PROFILE_RANKS, == *,"$1",* ]]
}

# RANK_CMD = what rank $1 (local rank $2, on host $3) runs: its environment, nsys when profiled, then "$@".
rank_command() {
  local rank=$1 local_rank=$2 host=$3
  shift 3
  RANK_CMD=(env "RANK=$rank" "LOCAL_RANK=$local_rank" "WORLD_SIZE=$WORLD_SIZE" "LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE"
    "MASTER_ADDR=$MASTER_ADDR" "MASTER_PORT=$MASTER_PORT" "RUN_ID=$RUN_ID"
    "TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton_cache_$rank}"           # per rank: no compile-cache races
    "TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch_extensions_$rank}")
  if is_profiled "$rank"; then
    RANK_CMD+=("$NSYS" "${NSYS_PROFILE_ARGS[@]}" -o "$NSYS_OUTPUT_DIR/$RUN_ID/profile-$host-rank$rank")
  fi
  RANK_CMD+=("$@")
}

# Internal mode, inside each SLURM task: SLURM's task ids become torch.distributed's, then the rank command runs.
exec_rank() {
  [[ -n ${SLURM_PROCID:-} ]] ||
    die "--rank-exec is srun.sh's own mode inside a SLURM task:" "run ./srun.sh RECIPE.py instead"
  WORLD_SIZE=$SLURM_NTASKS
  rank_command "$SLURM_PROCID" "$SLURM_LOCALID" "$(uname -n)" "$@"
  if is_profiled "$SLURM_PROCID"; then
    command -v "$NSYS" >/dev/null ||
      die "--nsys needs nsys, but NSYS=$(q "$NSYS") is not found on $(uname -n):" "install it in the image or set NSYS"
    mkdir -p -- "$NSYS_OUTPUT_DIR/$RUN_ID"
  fi
  exec "${RANK_CMD[@]}"
}

print_dry_run() {
  local -a launch=("$@")
  echo "# srun.sh --dry-run: nothing was started. Each command below is one line you can paste into a shell."
  if [[ -z ${SLURM_JOB_ID:-} ]] && ((!LOCAL)); then
    echo "# Not inside an allocation: job id JOBID and node list ${HOSTS[*]} are placeholders."
  fi
  [[ -z ${PREFLIGHT_NOTE:-} ]] || echo "# Note: $PREFLIGHT_NOTE."
  echo "# Environment srun.sh exports (every rank inherits it):"
  local name
  for name in NCCL_DEBUG OMP_NUM_THREADS NCCL_GIN_TYPE DEEP_EP_BACKEND MASTER_ADDR MASTER_PORT RUN_ID WORLD_SIZE \
    LOCAL_WORLD_SIZE NSYS NSYS_OUTPUT_DIR SRUN_SH_PROFILE_RANKS; do
    printf 'export %s=%q\n' "$name" "${!name}"
  done
  if ((${#launch[@]})); then
    echo "# Launch command (run it inside the allocation):"
    quoted "${launch[@]}"
  fi
  echo "# Rank commands (what each rank runs):"
  local rank
  for ((rank = 0; rank < WORLD_SIZE; rank++)); do
    # With SLURM, print rank 0 and every profiled rank (the others differ only in RANK and LOCAL_RANK).
    if ((LOCAL || rank == 0)) || is_profiled "$rank"; then
      rank_command "$rank" "$((rank % GPUS_PER_NODE))" "${HOSTS[rank / GPUS_PER_NODE]:-${HOSTS[0]}}" "${BASE_CMD[@]}"
      quoted "${RANK_CMD[@]}"
    fi
  done
}

launch_slurm() {
  local -a cmd=(srun --nodes="$NODES" --ntasks-per-node="$GPUS_PER_NODE" --mpi="$SRUN_MPI" --kill-on-bad-exit=1
    --label --quit-on-interrupt)
  if ((USE_CONTAINER)); then
    cmd+=("${CONTAINER_ARGS[@]}")
  fi
  cmd+=("${SRUN_EXTRA[@]}" "$SELF" --rank-exec "${BASE_CMD[@]}")
  if ((DRY_RUN)); then
    print_dry_run "${cmd[@]}"
    exit 0
  fi
  echo "# srun.sh: $NODES node(s) x $GPUS_PER_NODE rank(s), run $RUN_ID, master $MASTER_ADDR:$MASTER_PORT" >&2
  quoted "${cmd[@]}" >&2
  # exec: SIGINT/SIGTERM to srun.sh reach srun itself, which stops the step (--quit-on-interrupt for one SIGINT).
  exec "${cmd[@]}"
}

# Prefix every line of a rank's output with its rank, like srun --label.
label() {
  trap '' INT
  sed -u "s/^/$1: /"
}

# Alive and not yet a zombie.
is_running() {
  local stat
  read -r stat 2>/dev/null <"/proc/$1/stat" || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]]
}

# SIGTERM to every rank's process group, SIGKILL to what is left after STOP_GRACE_S, then reap them.
stop_ranks() {
  ((${#RANK_PIDS[@]})) || return 0
  local pid deadline=$((SECONDS + STOP_GRACE_S))
  for pid in "${RANK_PIDS[@]}"; do
    kill -TERM -- "-$pid" 2>/dev/null || true
  done
  for pid in "${RANK_PIDS[@]}"; do
    while is_running "$pid" && ((SECONDS < deadline)); do
      sleep 0.2
    done
  done
  for pid in "${RANK_PIDS[@]}"; do
    kill -KILL -- "-$pid" 2>/dev/null || true
  done
  wait "${RANK_PIDS[@]}" 2>/dev/null || true
  RANK_PIDS=()
}

launch_local() {
  local rank
  if ((DRY_RUN)); then
    print_dry_run
    exit 0
  fi
  echo "# srun.sh: $GPUS_PER_NODE local rank(s), run $RUN_ID, master $MASTER_ADDR:$MASTER_PORT; rank 0 runs:" >&2
  rank_command 0 0 "${HOSTS[0]}" "${BASE_CMD[@]}"
  quoted "${RANK_CMD[@]}" >&2

  ((USE_NSYS)) && mkdir -p -- "$NSYS_OUTPUT_DIR/$RUN_ID"
  RANK_PIDS=()
  local -A rank_of=()
  trap 'stop_ranks; exit 130' INT
  trap 'stop_ranks; exit 143' TERM
  trap 'stop_ranks' EXIT
  local -a label_pids=()
  local out err
  for ((rank = 0; rank < GPUS_PER_NODE; rank++)); do
    rank_command "$rank" "$rank" "${HOSTS[0]}" "${BASE_CMD[@]}"
    exec {out}> >(label "$rank")
    label_pids+=("$!")
    exec {err}> >(label "$rank" >&2)
    label_pids+=("$!")
    # setsid: each rank leads its own process group, so stopping it also stops what it started.
    setsid "${RANK_CMD[@]}" 1>&"$out" 2>&"$err" &
    RANK_PIDS+=("$!")
    rank_of[$!]=$rank
    exec {out}>&- {err}>&-
  done

  local status=0 done_pid
  while ((${#RANK_PIDS[@]})); do
    status=0 done_pid=''
    wait -n -p done_pid "${RANK_PIDS[@]}" || status=$?
    local -a left=()
    local pid
    for pid in "${RANK_PIDS[@]}"; do
      [[ $pid == "$done_pid" ]] || left+=("$pid")
    done
    RANK_PIDS=("${left[@]}")
    if ((status != 0)); then
      echo "srun.sh: rank ${rank_of[$done_pid]} exited with status $status; stopping the other ranks" >&2
      stop_ranks
      break
    fi
  done
  trap - INT TERM EXIT
  wait "${label_pids[@]}" 2>/dev/null || true
  exit "$status"
}

main() {
  if [[ ${1:-} == --rank-exec ]]; then
    shift
    exec_rank "$@"
  fi
  parse_args "$@"
  validate
  resolve_master
  CONTAINER_ARGS=(--container-image="$SQSH" --container-mounts="$MOUNT" --container-workdir="${TASK_WORKDIR:-}"
    --container-name="megatron-$RUN_ID")
  BASE_CMD=("$PYTHON" "$ENTRYPOINT" "$RECIPE_ARG" "${OVERRIDES[@]}")
  export_network_env
  preflight
  if ((LOCAL)); then
    launch_local
  else
    launch_slurm
  fi
}

main "$@"
