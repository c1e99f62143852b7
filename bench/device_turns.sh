#!/usr/bin/env bash
# The per-step A/B (bench/bench_turns.py) on a GPU machine in one command: its plans one after another, within
# TOTAL_S, each with the seconds left (less RESERVE_S for stopping its arms and writing its report).
#
#   export PYTHONPATH=/tmp/site; PLANS="tiny llama8b-ab" bash bench/device_turns.sh     # call 1, about 8 minutes
#   export PYTHONPATH=/tmp/site; PLANS="llama8b-levers" bash bench/device_turns.sh      # call 2, about 9 minutes
#
# Writes under $OUT: turns-PLAN.{md,json} for each plan (rewritten when the plan ends, also when it is stopped),
# device_turns.log (everything printed) and runs.tar.gz (each arm's timed console, TensorBoard events and the
# checks, enough for `bench_turns.py PREFIX --report --runs-dir DIR` to redo the report).
set -euo pipefail

# Plans, in order (bench/levers.py).                                               PLANS="llama8b-solo" ...
PLANS=${PLANS:-tiny llama8b-ab}
# GPUs of every arm (the llama8b-2gpu plan wants 2).                               GPUS_PER_ARM=2 ...
GPUS_PER_ARM=${GPUS_PER_ARM:-1}
# Seconds for the whole script (the device stops a command at 600).
TOTAL_S=${TOTAL_S:-560}
# Seconds of each plan's share kept for stopping its arms and writing its report.
RESERVE_S=${RESERVE_S:-45}
# Seconds the tiny plan may take (its 3 arms start in about 45 s; 10 rounds take about a minute).
TINY_S=${TINY_S:-150}
PYTHON=${PYTHON:-python3}

die() {
  echo "device_turns.sh: $*" >&2
  exit 1
}

main() {
  [[ -n ${OUT:-} && -d $OUT ]] || die "OUT is not a directory: run it where \$OUT is set, or OUT=/tmp/x bash $0"
  nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || die "nvidia-smi lists no GPU"
  local root work deadline plan left budget status=0
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  work=$(mktemp -d /tmp/turns.XXXXXX)
  deadline=$((SECONDS + TOTAL_S))
  exec > >(tee "$OUT/device_turns.log") 2>&1
  echo "device_turns.sh: plans: $PLANS, $GPUS_PER_ARM GPU(s) an arm, work in $work"
  cd "$root"
  for plan in $PLANS; do
    left=$((deadline - SECONDS - RESERVE_S))
    ((left > 60)) || { echo "device_turns.sh: no time left for $plan" && status=1 && break; }
    budget=$left
    [[ $plan != tiny ]] || ((budget < TINY_S)) || budget=$TINY_S
    # The plan stops starting rounds after its budget; SIGTERM after RESERVE_S more, SIGKILL 30 s after that.
    timeout --kill-after=30 "$((budget + RESERVE_S))" "$PYTHON" bench/bench_turns.py "$OUT/turns-$plan" \
      --plan "$plan" --gpus "$GPUS_PER_ARM" --budget-s "$budget" --runs-dir "$work/$plan" ||
      { echo "device_turns.sh: $plan ended with status $?" && status=1; }
  done
  (cd "$work" && find . \( -name console.log -o -name 'events.out.tfevents.*' -o -name '*.json' \) -print0 |
    tar -czf "$OUT/runs.tar.gz" --null -T -) || true
  return "$status"
}

main "$@"
