#!/usr/bin/env bash
# DeepEP on a GPU machine in one command: build it from a source tree with tools/build_deepep.sh, import it, check
# that megatron-core's flex dispatcher sees it, and run bench/deepep_dispatch_check.py (2 ranks: a GPU each, or
# sharing the one GPU); with 2 GPUs also DeepEP's own intranode test. Every step has a time limit.
#
#   export PYTHONPATH=/tmp/site; bash bench/deepep_device.sh .deepep/DeepEP      # about 4 minutes on one H200
#
# SRC_DIR: deepseek-ai/DeepEP at DEEPEP_COMMIT (versions.txt); its commit is read from SRC_DIR/COMMIT when the tree
# has no .git. Writes under $OUT: deepep-device.md (one row per step, rewritten after each), deepep-device.log
# (everything printed), deepep-build.log, deepep-dispatch.{md,json} and, on 2 GPUs, deepep-intranode.log.
set -euo pipefail

# Interpreter with torch and the Megatron stack.                                            PYTHON=python3 ...
PYTHON=${PYTHON:-python3}
# Where deep_ep is installed (pip --target), put first on PYTHONPATH.                      SITE=/tmp/deepep-site ...
SITE=${SITE:-/tmp/deepep-site}
# rdma-core's headers (infiniband/mlx5dv.h) for a machine without them; used only when the compiler lacks them.
RDMA_INCLUDE=${RDMA_INCLUDE:-.deepep/rdma-include}
# GPUs to compile for.                                                                      TORCH_CUDA_ARCH_LIST=9.0
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
# Seconds for the whole script (a device command may run 600); a step past it is not started.
TOTAL_S=${TOTAL_S:-480}

rows=()

die() {
  echo "deepep_device.sh: $*" >&2
  exit 2
}

write_table() {
  {
    echo "# DeepEP on $(hostname -s), $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "| step | result | seconds | detail |"
    echo "|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
  } >"$OUT/deepep-device.md"
}

# step NAME LIMIT_S DETAIL COMMAND...: run COMMAND (a program or a function of this script) under a time limit, in a
# bash of its own, and add its row to the table.
step() {
  local name=$1 limit=$2 detail=$3 start status=0 result=pass left
  shift 3
  left=$((deadline - SECONDS))
  if ((left < 20)); then
    rows+=("| $name | not run | 0 | no time left of TOTAL_S=$TOTAL_S |")
    write_table
    return 1
  fi
  ((limit <= left)) || limit=$left
  echo "deepep_device.sh: == $name (at most ${limit} s)"
  start=$SECONDS
  timeout --kill-after=15 "$limit" bash -o pipefail -c '"$@"' step "$@" || status=$?
  if ((status == 124)); then
    result="FAIL (over ${limit} s)"
  elif ((status != 0)); then
    result="FAIL (status $status)"
  fi
  rows+=("| $name | $result | $((SECONDS - start)) | $detail |")
  write_table
  return "$status"
}

source_commit() {
  local src=$1
  if [[ -e $src/.git ]]; then
    git -C "$src" rev-parse HEAD
  elif [[ -f $src/COMMIT ]]; then
    cat "$src/COMMIT"
  else
    echo "unknown (no .git, no COMMIT)"
  fi
}

environment() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$CUDA_HOME/bin/nvcc" --version | tail -n 2
  "$PYTHON" - <<'PY'
from importlib import metadata
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())))
for name in ("nvidia-nvshmem-cu13", "nvidia-nccl-cu13", "megatron-core"):
    try:
        print(name, metadata.version(name))
    except metadata.PackageNotFoundError:
        print(name, "not installed")
PY
}

import_check() {
  "$PYTHON" - <<'PY'
import deep_ep, deep_ep_cpp
from megatron.core.transformer.moe import fused_a2a
print("deep_ep from", deep_ep.__file__, "sm90 kernels:", deep_ep.Buffer.is_sm90_compiled())
print("megatron-core fused_a2a: HAVE_DEEP_EP =", fused_a2a.HAVE_DEEP_EP)
assert fused_a2a.HAVE_DEEP_EP and fused_a2a.fused_dispatch is not None, "megatron-core does not see deep_ep"
PY
}

build() {
  bash tools/build_deepep.sh "$1" >"$OUT/deepep-build.log" 2>&1
}

# DeepEP's own test: one process per GPU over NCCL, so it needs 2 GPUs (its kernels are built for 2, 4, 8 ranks).
intranode_test() {
  local src=$1
  (cd "$src/tests" && "$PYTHON" test_intranode.py --num-processes 2) >"$OUT/deepep-intranode.log" 2>&1
}

main() {
  (($# == 1)) || die "usage: bash bench/deepep_device.sh SRC_DIR (a checkout of deepseek-ai/DeepEP)"
  [[ -n ${OUT:-} && -d $OUT ]] || die "OUT is not a directory: run it where \$OUT is set, or OUT=/tmp/x bash $0 SRC_DIR"
  local root src gpus commit
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  src=$(cd "$1" && pwd)
  deadline=$((SECONDS + TOTAL_S))
  export PYTHON OUT CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PIP_TARGET=$SITE MAX_JOBS=${MAX_JOBS:-$(nproc)}
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  export -f environment build import_check intranode_test
  if ! echo '#include <infiniband/mlx5dv.h>' | c++ -E -x c++ - >/dev/null 2>&1 && [[ -d $RDMA_INCLUDE ]]; then
    CPATH="$(cd "$RDMA_INCLUDE" && pwd)${CPATH:+:$CPATH}"
    export CPATH
  fi
  exec > >(tee "$OUT/deepep-device.log") 2>&1
  gpus=$(nvidia-smi -L | grep -c '^GPU ') || die "nvidia-smi lists no GPU"
  commit=$(source_commit "$src")
  rm -rf "$SITE"
  cd "$root"
  step environment 30 "$gpus GPU(s)" environment || true
  step build 300 "DeepEP $commit for $TORCH_CUDA_ARCH_LIST, MAX_JOBS=$MAX_JOBS: deepep-build.log" build "$src" ||
    { tail -n 40 "$OUT/deepep-build.log" && return 1; }
  step import 60 "import deep_ep; megatron-core fused_a2a.HAVE_DEEP_EP" import_check || return 1
  local status=0
  step dispatch-check 180 "2 ranks on $gpus GPU(s) through fused_dispatch/fused_combine: deepep-dispatch.md" \
    "$PYTHON" bench/deepep_dispatch_check.py "$OUT/deepep-dispatch" --ranks 2 || status=1
  if ((gpus >= 2)); then
    step deepep-intranode-test 180 "DeepEP's tests/test_intranode.py, 2 processes: deepep-intranode.log" \
      intranode_test "$src" || status=1
  else
    rows+=("| deepep-intranode-test | not run | 0 | DeepEP's own tests need one GPU per rank (NCCL) and 2+ ranks |")
    write_table
  fi
  return "$status"
}

main "$@"
