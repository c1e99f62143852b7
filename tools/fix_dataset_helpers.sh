#!/usr/bin/env bash
# The megatron-core wheel ships its dataset helper already compiled but not the Makefile that Megatron Bridge runs
# (`make -C megatron/core/datasets`) on local rank 0 at start-up; without one, rank 0 exits and the other ranks hang.
# Give make a target that is the shipped library itself, so it finds nothing to do (and fails loudly if it is gone).
#
#   PYTHON=/path/to/python3 bash tools/fix_dataset_helpers.sh
set -euo pipefail

PYTHON=${PYTHON:-python3}

datasets=$("$PYTHON" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("megatron.core.datasets").origin))')
helper=$(find "$datasets" -maxdepth 1 -name 'helpers_cpp*.so' -printf '%f\n' | head -n 1)
if [ -z "$helper" ]; then
  echo "fix_dataset_helpers.sh: megatron-core has no compiled dataset helper in $datasets: reinstall megatron-core" >&2
  exit 1
fi
[ -f "$datasets/Makefile" ] && exit 0
printf '# Written by tools/fix_dataset_helpers.sh: the wheel ships %s prebuilt.\ndefault: %s\n' "$helper" "$helper" \
  >"$datasets/Makefile"
