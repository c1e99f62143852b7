#!/usr/bin/env bash
# Run the GPU suite (pytest -m gpu) on a GPU host with the pinned stack (the image, or a venv from
# tools/install_python_stack.sh; 2 GPUs for all of it: on one, the tests that need a second rank are skipped),
# and write its results:
#   bash bench/run_gpu_suite.sh RESULTS_DIR [PYTEST_ARGS ...]     (default PYTEST_ARGS: tests/gpu)
# Writes RESULTS_DIR/gpu-suite.{json,md,log}. Knobs: PYTHON (python3), NSYS (nsys binary for the --nsys test).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
results=${1:?usage: bench/run_gpu_suite.sh RESULTS_DIR [PYTEST_ARGS ...]}
shift
export PYTHON=${PYTHON:-python3} NSYS=${NSYS:-nsys}
export SRUNSH_PYTHON=$PYTHON SRUNSH_NSYS=$NSYS # what the tests' srun.sh launches run with
[ $# -gt 0 ] || set -- tests/gpu
mkdir -p "$results"
records="$results/gpu-suite.jsonl"
rm -f "$records"

PYTHON="$PYTHON" bash "$root/tools/fix_dataset_helpers.sh"
cd "$root"
status=0
GPU_RESULTS="$records" "$PYTHON" -m pytest -m gpu -o addopts="" -p no:cacheprovider -v "$@" \
  2>&1 | tee "$results/gpu-suite.log" || status=$?
"$PYTHON" -m tests.gpu.report "$records" "$results/gpu-suite"
exit "$status"
