#!/usr/bin/env bash
# Create the test environment in .venv: Python 3.12 with the pinned stack of versions.txt, the test tools, and the
# Debian packages the tests run for real (SLURM and munge, iproute2, the docker CLI). Idempotent; `make test` runs it
# when versions change.
#
# Knobs:
#   PYTHON312     a Python 3.12 interpreter (default: the first that runs of python3.12 on PATH and pyenv's 3.12.x)
#   TE_WHEEL_DIR  prebuilt transformer_engine_torch wheels (default: ../shared/device/wheels when present; without
#                 one, the extension is built from source: 6 min on 2 cores, needs nvcc)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/.venv"
PYTHON312=${PYTHON312:-}
default_wheels="$root/../shared/device/wheels"
[ -d "$default_wheels" ] || default_wheels=""
export TE_WHEEL_DIR=${TE_WHEEL_DIR:-$default_wheels}

die() {
  echo "setup_test_env.sh: $*" >&2
  exit 1
}

install_system_packages() {
  local missing=()
  command -v slurmctld >/dev/null || missing+=(slurm-wlm)
  command -v munged >/dev/null || missing+=(munge)
  command -v ip >/dev/null || missing+=(iproute2) # the test cluster's network namespaces and bridge
  command -v docker >/dev/null || missing+=(docker.io) # its CLI packs the build context; no daemon is started
  command -v make >/dev/null || missing+=(make)
  command -v strace >/dev/null || missing+=(strace) # tests/test_srun_processes.py traces a launch
  command -v g++ >/dev/null || missing+=(g++)       # TorchInductor compiles on the CPU (tests of SRUNSH_COMPILE_CACHE)
  [ ${#missing[@]} -eq 0 ] && return
  [ "$(id -u)" -eq 0 ] || die "missing ${missing[*]}: run as root, or install them with: sudo apt-get install ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# pyenv's python3.12 shim exists on PATH even when pyenv's selected version is another one, and then fails: try each
# candidate rather than trusting `command -v`.
find_python312() {
  local candidate
  for candidate in python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
    if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      command -v "$candidate"
      return
    fi
  done
}

create_venv() {
  PYTHON312=${PYTHON312:-$(find_python312)}
  [ -n "$PYTHON312" ] || die "python3.12 not found: install Python 3.12 (megatron-bridge 0.6 needs it) or set PYTHON312"
  [ -x "$venv/bin/python" ] || "$PYTHON312" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
}

# TE and torch dlopen the CUDA runtime and NCCL of the nvidia pip packages by soname; on a machine without a CUDA
# driver nothing else puts them on the loader path, so the venv's activate script does.
add_library_path_to_activate() {
  local site marker="# added by setup_test_env.sh"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  grep -qF "$marker" "$venv/bin/activate" && return
  # shellcheck disable=SC2016  # the last expansion is for activate to do, at activation time
  printf '%s\nexport LD_LIBRARY_PATH="%s/nvidia/cu13/lib:%s/nvidia/nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n' \
    "$marker" "$site" "$site" >>"$venv/bin/activate"
}

main() {
  install_system_packages
  create_venv
  PYTHON="$venv/bin/python" bash "$root/tools/install_python_stack.sh" --with-test-tools
  add_library_path_to_activate
  touch "$venv/.installed"
}

main "$@"
