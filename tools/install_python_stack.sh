#!/usr/bin/env bash
# Install the pinned Python stack of every rank ([python] in versions.txt) into the environment of PYTHON.
# Used by the Dockerfile (image) and by tools/setup_test_env.sh (test environment), so both get the same set.
#
#   PYTHON=/path/to/python3 bash tools/install_python_stack.sh [--with-test-tools]
#
# Knobs:
#   PYTHON          interpreter whose environment receives the packages (default: python3)
#   TE_WHEEL_DIR    folder holding a prebuilt transformer_engine_torch wheel for this torch/CUDA (optional; without
#                   it the PyTorch extension is built from its sdist, which needs nvcc: 6 min on 2 cores here)
set -euo pipefail

PYTHON=${PYTHON:-python3}
TE_WHEEL_DIR=${TE_WHEEL_DIR:-}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
versions="$root/versions.txt"

die() {
  echo "install_python_stack.sh: $*" >&2
  exit 1
}

# Print the name==version lines of one [section] of versions.txt.
section_pins() {
  sed -n "/^\[$1\]/,/^\[/p" "$versions" | grep -E '^[A-Za-z0-9_.-]+==' || true
}

pin_of() {
  section_pins python | grep -iE "^$1==" | cut -d= -f3
}

pip_install() {
  "$PYTHON" -m pip install --no-cache-dir --no-deps "$@"
}

# PyPI publishes nvidia-resiliency-ext only for glibc >= 2.39; its Python parts that Megatron Bridge imports run on
# older glibc too (Debian 12 has 2.36), so there it is installed by platform override into site-packages.
install_resiliency_ext() {
  local version site
  version=$(pin_of nvidia-resiliency-ext)
  if "$PYTHON" -c 'import platform, sys; sys.exit(tuple(map(int, platform.libc_ver()[1].split(".")[:2])) < (2, 39))'; then
    pip_install "nvidia-resiliency-ext==$version"
  else
    site=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    pip_install --upgrade --only-binary=:all: --implementation cp --python-version 3.12 \
      --platform manylinux_2_39_x86_64 --target "$site" "nvidia-resiliency-ext==$version"
  fi
}

# transformer-engine's PyTorch extension is published as source only: take a prebuilt wheel when one is given,
# else build it against the installed torch and the CUDA headers of the nvidia pip packages.
install_te_torch() {
  local version wheels=() build=() nvidia include_dirs
  version=$(pin_of transformer-engine-torch)
  if [ -n "$TE_WHEEL_DIR" ]; then
    shopt -s nullglob
    wheels=("$TE_WHEEL_DIR"/transformer_engine_torch-"$version"-*.whl)
    shopt -u nullglob
  fi
  if [ ${#wheels[@]} -gt 0 ]; then
    pip_install "${wheels[0]}"
    return
  fi
  local nvcc cuda_home
  nvcc=$(command -v nvcc) || die "nvcc not found: building transformer-engine-torch needs the CUDA toolkit (or set TE_WHEEL_DIR to a prebuilt wheel)"
  # The compiler's headers (crt/) come from CUDA_HOME, searched first (torch guesses it from nvcc's folder, wrong for
  # a wrapper script such as /usr/local/bin/nvcc); the libraries' headers (cuSPARSE, cuDNN, NCCL...) from the pip
  # packages whose libraries torch loads.
  cuda_home=${CUDA_HOME:-/usr/local/cuda}
  [ -d "$cuda_home/include" ] || cuda_home=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
  mapfile -t build < <(section_pins build)
  pip_install "${build[@]}"
  nvidia=$("$PYTHON" -c 'import nvidia; print(list(nvidia.__path__)[0])')
  include_dirs=$(find "$nvidia" -maxdepth 3 -type d -name include | paste -sd:)
  CUDA_HOME="$cuda_home" CPATH="$include_dirs${CPATH:+:$CPATH}" NVTE_FRAMEWORK=pytorch \
    MAX_JOBS="${MAX_JOBS:-$(nproc)}" pip_install --no-build-isolation "transformer-engine-torch==$version"
}

main() {
  local pins=() tools=()
  [ -f "$versions" ] || die "versions.txt not found next to tools/"
  mapfile -t pins < <(section_pins python | grep -viE '^(nvidia-resiliency-ext|transformer-engine-torch)==')
  [ ${#pins[@]} -gt 0 ] || die "no [python] pins in $versions"
  pip_install "${pins[@]}"
  install_resiliency_ext
  install_te_torch
  PYTHON="$PYTHON" bash "$root/tools/fix_dataset_helpers.sh"
  if [ "${1:-}" = "--with-test-tools" ]; then
    mapfile -t tools < <(section_pins test)
    pip_install "${tools[@]}"
  fi
}

main "$@"
