#!/usr/bin/env bash
# Build DeepEP from a checked-out source tree and install it into the environment of PYTHON. A placeholder with the
# interface the Dockerfile calls; the full script (checks of the source, torch, nvcc and NVSHMEM) comes with the
# DeepEP work.
#
#   PYTHON=/opt/venv/bin/python NCCL_DIR=DIR TORCH_CUDA_ARCH_LIST=9.0 bash tools/build_deepep.sh SRC_DIR
#
# Knobs:
#   PYTHON                interpreter whose environment receives deep_ep (default: python3)
#   NCCL_DIR              NCCL with include/ and lib/ that DeepEP builds against (DeepEP's own default: the
#                         nvidia-nccl-cu13 wheel in PYTHON's environment)
#   TORCH_CUDA_ARCH_LIST  GPU architectures to compile for, e.g. 9.0 (required)
set -euo pipefail

PYTHON=${PYTHON:-python3}

die() {
  echo "build_deepep.sh: $*" >&2
  exit 2
}

main() {
  [[ $# -eq 1 ]] || die "usage: build_deepep.sh SRC_DIR"
  [[ -f $1/setup.py ]] || die "$1 holds no setup.py: pass a checkout of deepseek-ai/DeepEP"
  [[ -n ${TORCH_CUDA_ARCH_LIST:-} ]] || die "TORCH_CUDA_ARCH_LIST is not set: say which GPUs to build for, e.g. 9.0"
  export TORCH_CUDA_ARCH_LIST
  [[ -z ${NCCL_DIR:-} ]] || export NCCL_DIR
  (cd "$1" && "$PYTHON" -m pip install --no-cache-dir --no-deps --no-build-isolation .)
  "$PYTHON" -c 'import importlib.metadata as m; print("deep_ep", m.version("deep_ep"))'
}

main "$@"
