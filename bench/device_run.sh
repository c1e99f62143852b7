#!/usr/bin/env bash
# The start-up A/B (bench/bench_startup.py) on a GPU machine, in one command: the tiny recipe, then the Llama 3 8B
# shape (4 layers on one GPU, all 32 on two), our launch against the upstream one, on this machine's GPUs (at most 2).
#
#   export PYTHONPATH=/tmp/site; bash bench/device_run.sh          # about 9 minutes on one H200
#
# Writes under $OUT: startup-tiny.{md,json}, startup-llama8b-shape.{md,json} (rewritten after every launch, so a run
# cut short keeps what it measured), device_run.log (everything printed) and console-logs.tar.gz (each launch's
# timed console). Expected on one H200: tiny, a warm-up pair then 2 rounds = 6 launches of about 50 s; the Llama
# shape, 2 rounds = 4 launches of about 60 s; 9 minutes in all. On two GPUs the 32-layer shape takes longer: run it
# in a call of its own (CASES=llama8b-shape).
set -euo pipefail

# Rounds per case: A B, then B A, ...                                                  ROUNDS=4 bash bench/device_run.sh
ROUNDS=${ROUNDS:-2}
# Uncounted A B pairs before the tiny rounds: cold caches (files, kernels) out of the figures.           WARMUP=0 ...
WARMUP=${WARMUP:-1}
# Cases, in order.                                                                        CASES=llama8b-shape ...
CASES=${CASES:-tiny llama8b-shape}
# Seconds one launch may run before it is stopped.                                       LAUNCH_TIMEOUT_S=200 ...
LAUNCH_TIMEOUT_S=${LAUNCH_TIMEOUT_S:-150}
# Seconds for the whole script (the device stops a command at 600); a case past it is stopped where it is.
TOTAL_S=${TOTAL_S:-570}
PYTHON=${PYTHON:-python3}

die() {
  echo "device_run.sh: $*" >&2
  exit 1
}

main() {
  [[ -n ${OUT:-} && -d $OUT ]] || die "OUT is not a directory: run it where \$OUT is set, or OUT=/tmp/x bash $0"
  local gpus
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') || die "nvidia-smi lists no GPU"
  ((gpus <= 2)) || gpus=2
  local root work deadline case warmup status=0
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  work=$(mktemp -d /tmp/startup.XXXXXX)
  deadline=$((SECONDS + TOTAL_S))
  exec > >(tee "$OUT/device_run.log") 2>&1
  echo "device_run.sh: $gpus GPU(s), cases: $CASES, rounds $ROUNDS, warm-up pairs $WARMUP (tiny), work in $work"
  cd "$root"
  for case in $CASES; do
    warmup=0
    [[ $case != tiny ]] || warmup=$WARMUP
    ((deadline - SECONDS > 60)) || { echo "device_run.sh: no time left for $case" && status=1 && break; }
    # SIGTERM at the deadline: bench_startup.py stops the launch in flight (a minute at most) and exits.
    timeout --kill-after=90 "$((deadline - SECONDS))" "$PYTHON" bench/bench_startup.py "$OUT/startup-$case" \
      --case "$case" --gpus "$gpus" --rounds "$ROUNDS" --warmup "$warmup" --timeout "$LAUNCH_TIMEOUT_S" \
      --runs-dir "$work/$case" || { echo "device_run.sh: $case ended with status $?" && status=1; }
  done
  (cd "$work" && find . -name console.log -print0 | tar -czf "$OUT/console-logs.tar.gz" --null -T -) || true
  return "$status"
}

main "$@"
