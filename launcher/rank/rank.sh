#!/usr/bin/env bash
# One rank: `srun.sh --rank-exec COMMAND...` runs this once per rank, started by srun in every task (or by torchrun
# with --local). It gives the rank its torch.distributed identity, checks that the rank has a GPU, keeps its output in
# RUN_DIR/logs/rank-RANK.log beside its lines labelled "RANK: " for srun.sh's console, and records how it ended in
# RUN_DIR/logs/rank-RANK.status ("STATUS EPOCH_SECONDS HOST") for the launch's failure report. The log's writers are
# processes of their own: they outlive a SIGTERM or a crash of the rank, so its last words are kept.
set -euo pipefail

die() {
  printf 'srun.sh: %s\n' "$*" >&2
  exit 2
}

# A rank that cannot start says why in one line, in its log and once for the whole job (the first rank to get there
# leaves it for srun.sh's report, as entrypoint.py does with a config error), and leaves its status for the report.
rank_fails() {
  local line="srun.sh: $*"
  (umask 077 && printf '%s\n' "$line" >>"$RANK_LOG")
  (set -o noclobber && umask 077 && printf '%s\n' "$line" >"$RUN_DIR/logs/usage-error") 2>/dev/null || true
  record_rank_status 2
  exit 2
}

record_rank_status() {
  (umask 077 && printf '%s %s %s\n' "$1" "$(date +%s.%N)" "$(uname -n)" >"$RUN_DIR/logs/rank-$RANK.status")
}

# GPUs a process here sees: CUDA_VISIBLE_DEVICES when set (even empty), else the NVIDIA device files.
visible_gpus() {
  if [[ -v CUDA_VISIBLE_DEVICES ]]; then
    local -a ids
    IFS=, read -ra ids <<<"$CUDA_VISIBLE_DEVICES"
    printf '%s\n' "${ids[@]}" | grep -c . || true # the non-empty ids
  else
    { compgen -G '/dev/nvidia[0-9]*' || true; } | wc -l
  fi
}

# A rank without a GPU of its own: the hint names what can work (SRUNSH_GPUS_PER_NODE=0 cannot).
check_rank_gpu() {
  local visible
  visible=$(visible_gpus)
  ((LOCAL_RANK >= visible)) || return 0
  local rank devices allocate="salloc --gpus-per-node=$LOCAL_WORLD_SIZE"
  rank="rank $RANK (local rank $LOCAL_RANK) on $(uname -n)"
  printf -v devices 'CUDA_VISIBLE_DEVICES=%q' "${CUDA_VISIBLE_DEVICES-unset}"
  if ((visible == 0)); then
    rank_fails "$rank sees no GPU ($devices): allocate GPUs for the job ($allocate)"
  fi
  rank_fails "$rank sees $visible GPU(s) ($devices): set SRUNSH_GPUS_PER_NODE=$visible or allocate" \
    "$LOCAL_WORLD_SIZE GPUs a node ($allocate)"
}

# Gloo (Megatron's CPU groups, torch's store fallbacks) binds the address the host's own name resolves to, which is
# 127.0.1.1 on Debian/Ubuntu: across nodes it must use the interface that reaches the master instead.
export_gloo_interface() {
  [[ -z ${GLOO_SOCKET_IFNAME:-} ]] && ((WORLD_SIZE > LOCAL_WORLD_SIZE)) && command -v ip >/dev/null || return 0
  local interface
  interface=$(ip -o -4 addr show | awk -v a="$MASTER_ADDR" '{ split($4, p, "/") } p[1] == a { print $2; exit }')
  [[ -n $interface ]] ||
    interface=$(ip -o route get "$MASTER_ADDR" | awk '{ for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit } }')
  [[ -z $interface ]] || export GLOO_SOCKET_IFNAME=$interface
}

# Triton's and TorchInductor's caches, one folder per rank of a node so that no two ranks race on one: in the node's
# SRUNSH_COMPILE_CACHE (as srun.sh checked it), where the next launch on this node finds the kernels compiled, or (off)
# in /tmp; a value the user set wins. The folder is this user's alone: a cache holds shared libraries the rank loads.
export_compile_caches() {
  local root=${SRUNSH_COMPILE_CACHE:-off}
  if [[ $root == off ]]; then
    export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton_cache_$RANK}
    return
  fi
  local own=$root/srunsh-compile-cache-uid$UID error mode
  local dir=$own/local-rank-$LOCAL_RANK
  error=$(umask 077 && mkdir -p -- "$dir" 2>&1) ||
    rank_fails "rank $RANK on $(uname -n) cannot create its compile cache $(printf %q "$dir") (${error##*: }):" \
      "SRUNSH_COMPILE_CACHE must be a writable directory on every node, or off"
  mode=$(stat -c %a -- "$own")
  if [[ -L $own || ! -O $own ]] || ((8#$mode & 8#022)); then
    rank_fails "compile cache $(printf %q "$own") on $(uname -n) is not this user's alone (owner" \
      "$(stat -c %U -- "$own"), mode $mode): remove it, or set SRUNSH_COMPILE_CACHE to another directory, or off"
  fi
  export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$dir/triton}
  export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$dir/inductor}
}

# The node's directory for local checkpoints (SRUNSH_LOCAL_CKPT_DIR, as srun.sh checked it), where a launch that keeps
# work saves every few steps: it must exist and be writable on every node.
check_local_checkpoints() {
  local root=${SRUNSH_LOCAL_CKPT_DIR:-off}
  [[ ${SRUNSH_KEEP_WORK:-0} == 1 && $root != off ]] || return 0
  [[ -d $root && -w $root ]] ||
    rank_fails "rank $RANK on $(uname -n) cannot keep local checkpoints in $(printf %q "$root") (missing or not" \
      "writable): SRUNSH_LOCAL_CKPT_DIR must be a writable directory on every node's own disk, or off"
}

# The lines to srun.sh's console get the rank as label; the log gets each whole, in one write, or a stdout and a stderr
# line could splice (an unbuffered python writes a line's text and its newline apart). Both outlive a SIGTERM.
label_and_log() {
  trap '' INT TERM
  umask 077
  sed -u '' | tee -a "$1" | sed -u "s/^/$RANK: /"
}

# Into the caller's PIDS (pid -> command line): the other processes that hold a write end of pipe $1 or $2 (pipe:[N]).
find_holders() {
  local holder pid flags
  pids=()
  while IFS= read -r holder; do
    pid=${holder#/proc/} && pid=${pid%%/*}
    { read -r _ && read -r _ flags; } 2>/dev/null <"/proc/$pid/fdinfo/${holder##*/}" || continue # gone meanwhile
    [[ $pid != "$$" && $flags == *[12] ]] || continue                                              # a write end
    pids[$pid]=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || true
  done < <(find /proc/[0-9]*/fd -maxdepth 1 \( -lname "pipe:?${1//[^0-9]/}?" -o -lname "pipe:?${2//[^0-9]/}?" \) 2>/dev/null)
}

# What the rank started and left running when it ended (an asynchronous checkpoint writer, a multiprocessing manager
# it forked) holds its output pipes: the log writers would wait for it for ever, and it keeps GPU memory. It gets $1
# seconds to end by itself, then SIGTERM, and SIGKILL 5 s later; the rank's log names it.
stop_leftovers() {
  local -A pids=()
  local deadline=$((SECONDS + $1)) said="" pid
  while find_holders "$2" "$3" && ((${#pids[@]} && SECONDS < deadline)); do sleep 1; done
  ((${#pids[@]})) || return 0
  for pid in "${!pids[@]}"; do said+=" [$pid] ${pids[$pid]:0:200};"; done
  printf 'srun.sh: rank %s ended and left %s process(es) running, stopped now:%s\n' "$RANK" "${#pids[@]}" "$said" \
    >>"$RANK_LOG"
  kill -TERM "${!pids[@]}" 2>/dev/null || return 0
  for _ in {1..50}; do sleep 0.1 && kill -0 "${!pids[@]}" 2>/dev/null || return 0; done
  kill -KILL "${!pids[@]}" 2>/dev/null || true
}

main() {
  # Started by srun.sh: it set RUN_DIR, and either torchrun set RANK (--local) or the task is a step of SLURM's.
  [[ -n ${RUN_DIR:-} && (-n ${RANK:-} || -n ${SLURM_STEP_ID:-}) ]] ||
    die "--rank-exec is srun.sh's own mode for one rank:" "run ./srun.sh RECIPE.py instead"
  [[ -n ${RANK:-} ]] || RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID # SLURM's task ids become torch.distributed's
  export RANK LOCAL_RANK
  # srun.sh's hang report signals every process of the step (SIGUSR2): only the rank answers (launcher/hang/dumps.py)
  # and the rest, this shell and its log writers among them, ignore it, as the rank does until it answers.
  trap '' USR2
  export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch_extensions_$RANK} # per rank: no build races
  RANK_LOG=$RUN_DIR/logs/rank-$RANK.log
  local error
  error=$(umask 077 && mkdir -p -- "$RUN_DIR/logs" 2>&1) ||
    die "rank $RANK on $(uname -n) cannot write its log in $(printf %q "$RUN_DIR/logs") (${error##*: }):" \
      "SRUNSH_OUTPUT_ROOT must be writable on every node"
  check_rank_gpu
  export_compile_caches
  check_local_checkpoints
  export_gloo_interface

  local out err status=0
  local -a log_pids=()
  exec {out}> >(label_and_log "$RANK_LOG")
  log_pids+=("$!")
  exec {err}> >(exec {out}>&- && label_and_log "$RANK_LOG" >&2) # only the rank's processes hold the write ends
  log_pids+=("$!")
  # The rank is this shell's only child, in the foreground: a signal reaches it directly (srun and torchrun signal
  # every process of the rank), and this shell outlives it to record how the rank ended, quietly (srun.sh reports).
  trap : INT TERM
  { "$@" 1>&"$out" 2>&"$err"; } 2>/dev/null || status=$?
  record_rank_status "$status"
  local -a pipes=("$(readlink "/proc/$$/fd/$out")" "$(readlink "/proc/$$/fd/$err")")
  exec {out}>&- {err}>&-
  # Under in-process restart NVRx's monitor outlives a dead rank by design, until the restart has counted the rank
  # out (its barrier: 120 s by default): what is left gets 300 s there, else 5 s.
  stop_leftovers "$((${SRUNSH_INPROCESS:-0} == 1 ? 300 : 5))" "${pipes[@]}"
  wait "${log_pids[@]}"
  exit "$status"
}

# Sourced (the launching host counts its GPUs with visible_gpus, as each rank does): the functions only.
[[ ${BASH_SOURCE[0]} != "$0" ]] || main "$@"
