#!/usr/bin/env bash
# Build DeepEP from a checked-out source tree and install it into the environment of PYTHON, then import it there.
# The one recipe for the image (Dockerfile) and for a GPU host that has the rest of the stack.
#
#   PYTHON=python3 TORCH_CUDA_ARCH_LIST=9.0 bash tools/build_deepep.sh SRC_DIR
#
# SRC_DIR is deepseek-ai/DeepEP at DEEPEP_COMMIT (versions.txt): DeepEP V1, whose Buffer API (get_dispatch_layout,
# dispatch, combine, set_num_sms, deep_ep.utils.EventOverlap) is what megatron-core 0.19.2's flex dispatcher calls,
# with the NCCL backend of deepseek-ai/DeepEP pull request 521 (csrc/kernels/nccl_gin_backend.cu). Its intranode
# kernels (EP within a node, over NVLink) share CUDA IPC buffers; its internode and low-latency kernels go over
# NCCL's GPU-initiated networking (GIN) when built with NCCL_DIR, which is what EFA offers, or else over NVSHMEM's
# InfiniBand transport (IBGDA), which EFA does not.
#
# Knobs:
#   PYTHON                interpreter whose environment receives deep_ep (default: python3); pip's own PIP_*
#                         variables pass through (PIP_TARGET=DIR installs into DIR, which must then be on PYTHONPATH)
#   TORCH_CUDA_ARCH_LIST  GPU architectures to compile for, e.g. 9.0 (H100/H200) or "9.0;10.0" (required)
#   CUDA_HOME             CUDA toolkit whose nvcc compiles the kernels (default: /usr/local/cuda)
#   NCCL_DIR              an NCCL with the Device API, 2.29.2 or newer (README-NCCL.md), holding include/ and lib/, such
#                         as the nvidia-nccl-cu13 wheel's nvidia/nccl: DeepEP's NCCL (GIN) backend; unset: NVSHMEM's
#   NVSHMEM_DIR           without NCCL_DIR: an NVSHMEM installation with include/ and lib/ (default: the
#                         nvidia-nvshmem-cu13 wheel that torch depends on, in PYTHON's environment)
#   MAX_JOBS              parallel compile jobs (torch's knob; default: one per core)
set -euo pipefail

PYTHON=${PYTHON:-python3}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

die() {
  echo "build_deepep.sh: $1" >&2
  exit "${2:-1}"
}

check_source() {
  local src=$1
  [[ -f $src/setup.py ]] || die "$src holds no setup.py: pass a checkout of deepseek-ai/DeepEP" 2
  # V2 (deep_ep/buffers/) moved EventOverlap out of deep_ep.utils, so megatron-core 0.19.2 would not see it at all.
  [[ -f $src/deep_ep/buffer.py && -f $src/deep_ep/utils.py ]] ||
    die "$src is not DeepEP V1 (no deep_ep/buffer.py and deep_ep/utils.py), the API megatron-core 0.19.2 calls: check out DEEPEP_COMMIT of versions.txt" 2
}

check_arch_list() {
  [[ -n ${TORCH_CUDA_ARCH_LIST:-} ]] || die "TORCH_CUDA_ARCH_LIST is not set: say which GPUs to build for, e.g. TORCH_CUDA_ARCH_LIST=9.0" 2
  [[ $TORCH_CUDA_ARCH_LIST =~ ^[0-9]+\.[0-9]+a?([\;\ ][0-9]+\.[0-9]+a?)*$ ]] ||
    die "TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST is not a list of compute capabilities like 9.0 or \"9.0;10.0\"" 2
  export TORCH_CUDA_ARCH_LIST
}

# Prints torch's CUDA major version; torch itself refuses an nvcc of another major version, with a longer message.
torch_cuda_major() {
  local cuda
  cuda=$("$PYTHON" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null) ||
    die "$PYTHON cannot import torch: DeepEP builds against the torch it will run with (PYTHON=...)"
  [[ -n $cuda ]] || die "$PYTHON's torch is a CPU-only build: DeepEP needs a CUDA torch"
  echo "${cuda%%.*}"
}

check_nvcc() {
  local torch_major=$1 nvcc_major
  [[ -x $CUDA_HOME/bin/nvcc ]] || die "no nvcc in CUDA_HOME=$CUDA_HOME: set CUDA_HOME to a CUDA $torch_major toolkit"
  nvcc_major=$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
  [[ $nvcc_major == "$torch_major" ]] ||
    die "nvcc in $CUDA_HOME is CUDA $nvcc_major, torch was built with CUDA $torch_major: set CUDA_HOME to a CUDA $torch_major toolkit"
  export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH"
}

# NVSHMEM from the nvidia-nvshmem-cu13 wheel, torch's own dependency, is one library for torch and DeepEP alike.
# DeepEP's setup.py finds that wheel itself (and links its host library by the versioned name the wheel ships); an
# NVSHMEM_DIR it links by the plain name libnvshmem_host.so, as NVSHMEM's own packages install it.
check_nvshmem() {
  local dir host=libnvshmem_host.so
  if [[ -n ${NVSHMEM_DIR:-} ]]; then
    dir=$NVSHMEM_DIR
  else
    dir=$("$PYTHON" -c 'import nvidia.nvshmem as n; print(list(n.__path__)[0])' 2>/dev/null) ||
      die "no NVSHMEM: install nvidia-nvshmem-cu13 (the version torch pins) into $PYTHON's environment, or set NVSHMEM_DIR"
    host=libnvshmem_host.so.3
  fi
  [[ -f $dir/include/nvshmem.h && -f $dir/lib/libnvshmem_device.a && -e $dir/lib/$host ]] ||
    die "NVSHMEM in $dir lacks include/nvshmem.h, lib/libnvshmem_device.a or lib/$host: point NVSHMEM_DIR at an NVSHMEM installation"
  NVSHMEM_FOUND=$dir
}

NCCL_BACKEND_MINIMUM=2.29.2 # DeepEP's README-NCCL.md

# DeepEP's NCCL backend, over the NCCL torch loads too (the wheel's libnccl.so.2, found again through the rpath that
# setup.py gives the extension).
use_nccl_backend() {
  local src=$1 nccl=$NCCL_DIR version
  [[ -f $src/csrc/kernels/nccl_gin_backend.cu ]] ||
    die "$src has no NCCL backend (csrc/kernels/nccl_gin_backend.cu): check out DEEPEP_COMMIT of versions.txt, or unset NCCL_DIR to build with NVSHMEM" 2
  [[ -f $nccl/include/nccl.h && -f $nccl/include/nccl_device.h && -e $nccl/lib/libnccl.so.2 ]] ||
    die "NCCL_DIR=$nccl lacks include/nccl.h, include/nccl_device.h or lib/libnccl.so.2: point it at an NCCL with the Device API (the nvidia-nccl-cu13 wheel's nvidia/nccl)" 2
  # MAJOR.MINOR.PATCH, from nccl.h
  version=$(sed -n -E 's/^#define NCCL_(MAJOR|MINOR|PATCH) ([0-9]+).*/\2/p' "$nccl/include/nccl.h" | paste -sd.)
  [[ $(printf '%s\n' "$NCCL_BACKEND_MINIMUM" "$version" | sort -V | head -n 1) == "$NCCL_BACKEND_MINIMUM" ]] ||
    die "NCCL_DIR=$nccl holds NCCL $version; DeepEP's NCCL backend needs $NCCL_BACKEND_MINIMUM or newer" 2
  # setup.py links -lnccl, and the wheel ships only the soname.
  [[ -e $nccl/lib/libnccl.so ]] || ln -s libnccl.so.2 "$nccl/lib/libnccl.so"
  export ENABLE_NCCL=1 NCCL_DIR=$nccl
  BACKEND="NCCL $version (GIN) in $nccl"
}

use_nvshmem_backend() {
  unset NCCL_DIR # setup.py finds the NVSHMEM wheel only when neither NCCL_DIR nor NVSHMEM_DIR is set
  check_nvshmem
  check_rdma_headers
  export ENABLE_NCCL=0
  BACKEND="NVSHMEM in $NVSHMEM_FOUND"
}

# NVSHMEM's IBGDA headers, which DeepEP's kernels include, include rdma-core's <infiniband/mlx5dv.h> (headers only:
# nothing links libibverbs or libmlx5).
check_rdma_headers() {
  echo '#include <infiniband/mlx5dv.h>' | c++ -E -x c++ - >/dev/null 2>&1 ||
    die "no <infiniband/mlx5dv.h>, which NVSHMEM's headers include: install rdma-core's headers (Ubuntu, Debian: libibverbs-dev) or add their folder to CPATH"
}

# torch's CUDA headers include the math libraries' (cusparse.h...): take them from the pip packages whose libraries
# torch loads, after CUDA_HOME's own (torch passes -I CUDA_HOME/include; CPATH comes after it), as a toolkit
# without the math libraries lacks them.
add_library_headers() {
  local nvidia include_dirs
  nvidia=$("$PYTHON" -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null) || return 0
  include_dirs=$(find "$nvidia" -maxdepth 3 -type d -name include | paste -sd:)
  export CPATH="${CPATH:+$CPATH:}$include_dirs"
}

# CUDA 13 keeps libcu++ (<cuda/std/...>, which the NVSHMEM headers include) under include/cccl, where nvcc looks by
# itself but the host compiler, which builds DeepEP's C++ binding, does not.
add_cccl_include() {
  local cccl=$CUDA_HOME/include/cccl
  [[ -d $cccl ]] || return 0
  export CPLUS_INCLUDE_PATH="$cccl${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
}

# DeepEP links the CUDA driver (-lcuda). A build host without a driver (docker build) links CUDA's stub; a machine
# whose driver came without the libcuda.so development link (a container given only libcuda.so.1) links that.
find_libcuda() {
  local lib link_dir
  [[ $(c++ -print-file-name=libcuda.so) != /* ]] || return 0
  if [[ -f $CUDA_HOME/lib64/stubs/libcuda.so ]]; then
    export LIBRARY_PATH="$CUDA_HOME/lib64/stubs${LIBRARY_PATH:+:$LIBRARY_PATH}"
    return
  fi
  lib=$(ldconfig -p | awk '$1 == "libcuda.so.1" { print $NF; exit }')
  [[ -n $lib ]] || die "no libcuda.so to link against: install the CUDA driver or a CUDA toolkit with lib64/stubs in CUDA_HOME"
  link_dir=$(mktemp -d)
  ln -s "$lib" "$link_dir/libcuda.so"
  export LIBRARY_PATH="$link_dir${LIBRARY_PATH:+:$LIBRARY_PATH}"
}

build_and_install() {
  local src=$1
  # setup.py appends `git rev-parse --short HEAD` to its version: stop git at SRC_DIR, so that a source tree without
  # its own .git does not take the commit of a repository around it.
  GIT_CEILING_DIRECTORIES=$(dirname "$src") \
    "$PYTHON" -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir "$src"
}

# deep_ep_cpp needs libcuda.so.1 to load; a build host without a GPU driver (docker build) lends it CUDA's stub.
import_check() {
  local stub_dir
  if "$PYTHON" -c 'import ctypes; ctypes.CDLL("libcuda.so.1")' 2>/dev/null; then
    "$PYTHON" -c 'import deep_ep; print("build_deepep.sh: import deep_ep:", deep_ep.__file__)'
    return
  fi
  [[ -f $CUDA_HOME/lib64/stubs/libcuda.so ]] || die "no libcuda.so.1 and no CUDA stub to import deep_ep with"
  stub_dir=$(mktemp -d)
  ln -s "$CUDA_HOME/lib64/stubs/libcuda.so" "$stub_dir/libcuda.so.1"
  LD_LIBRARY_PATH="$stub_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$PYTHON" -c \
    'import deep_ep; print("build_deepep.sh: import deep_ep (CUDA driver stub, no GPU here):", deep_ep.__file__)'
  rm -r "$stub_dir"
}

main() {
  (($# == 1)) || die "usage: PYTHON=... TORCH_CUDA_ARCH_LIST=... bash tools/build_deepep.sh SRC_DIR" 2
  [[ -d $1 ]] || die "SRC_DIR $1 is not a directory: pass a checkout of deepseek-ai/DeepEP" 2
  local src torch_major
  src=$(cd "$1" && pwd)
  check_source "$src"
  check_arch_list
  torch_major=$(torch_cuda_major)
  check_nvcc "$torch_major"
  add_library_headers
  if [[ -n ${NCCL_DIR:-} ]]; then
    use_nccl_backend "$src"
  else
    use_nvshmem_backend
  fi
  add_cccl_include
  find_libcuda
  echo "build_deepep.sh: DeepEP from $src for $TORCH_CUDA_ARCH_LIST, nvcc $CUDA_HOME, $BACKEND"
  build_and_install "$src"
  import_check
}

main "$@"
