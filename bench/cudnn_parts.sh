#!/usr/bin/env bash
# cuDNN 9.27 for the cuDNN lever of the per-step A/B (bench/levers.py: cudnn_9_27). PyPI's wheel is 537 MB and a
# device call carries 64 MiB, so it goes over in pieces while the machine stays warm (a call within 30 s of the last).
#
#   bash bench/cudnn_parts.sh stage                   # here (needs PyPI): .cudnn/c0 ... .cudnn/c8, 60 MiB each
#   bash bench/cudnn_parts.sh install .cudnn/cN       # on the device, one call a piece, carrying .cudnn/cN
#
# The call that brings the last piece checks the wheel's sha256, unpacks it where levers.NEWER_CUDNN points and runs
# bench/cudnn_check.py with the device's cuDNN and in the lever arms' environments.
set -euo pipefail

VERSION=9.27.0.42
PIECE_BYTES=$((60 * 1024 * 1024))
PIECES_DIR=/tmp/cudnn-pieces
# levers.NEWER_CUDNN is TARGET/nvidia/cudnn/lib.
TARGET=/tmp/cudnn-9.27
PYTHON=${PYTHON:-python3}
wheel=nvidia_cudnn_cu13-$VERSION-py3-none-manylinux_2_27_x86_64.whl

die() {
  echo "cudnn_parts.sh: $*" >&2
  exit 2
}

stage() {
  local root download
  root=$(git rev-parse --show-toplevel)
  download=$(mktemp -d)
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_27_x86_64 -d "$download" "nvidia-cudnn-cu13==$VERSION"
  rm -rf "$root/.cudnn"
  mkdir -p "$root/.cudnn"
  (cd "$download" && sha256sum "$wheel" >"$root/.cudnn/SHA256SUMS" &&
    split -b "$PIECE_BYTES" -d -a 1 "$wheel" "$root/.cudnn/$wheel.")
  local count=0 piece
  for piece in "$root/.cudnn/$wheel".*; do
    mkdir "$root/.cudnn/c$count"
    mv "$piece" "$root/.cudnn/c$count/"
    count=$((count + 1))
  done
  for piece in "$root"/.cudnn/c*; do
    cp "$root/.cudnn/SHA256SUMS" "$piece/"
    echo "$count" >"$piece/COUNT"
  done
  rm -rf "$download" "$root/.cudnn/SHA256SUMS"
  echo "cudnn_parts.sh: carry .cudnn/c0 ... .cudnn/c$((count - 1)), one a call: bash bench/cudnn_parts.sh install .cudnn/cN"
}

# The other CUDA libraries the wheel's RUNPATH names beside it ($ORIGIN/../../cublas/lib, ...): the interpreter's own.
link_siblings() {
  local nvidia sibling
  nvidia=$("$PYTHON" -c 'import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__path__[0]))')
  for sibling in "$nvidia"/*/; do
    sibling=${sibling%/}
    [[ $(basename "$sibling") == cudnn ]] || ln -sfn "$sibling" "$TARGET/nvidia/$(basename "$sibling")"
  done
}

install() {
  local piece=$1 have want
  [[ -f $piece/COUNT ]] || die "$piece is not a piece of bench/cudnn_parts.sh stage: run that here first"
  mkdir -p "$PIECES_DIR"
  cp "$piece"/* "$PIECES_DIR/"
  want=$(<"$PIECES_DIR/COUNT")
  have=$(find "$PIECES_DIR" -name "$wheel.*" | wc -l)
  echo "cudnn_parts.sh: $have of $want pieces on this machine"
  ((have == want)) || return 0
  cat "$PIECES_DIR/$wheel".* >"$PIECES_DIR/$wheel"
  (cd "$PIECES_DIR" && sha256sum -c SHA256SUMS)
  rm -rf "$TARGET"
  "$PYTHON" -m zipfile -e "$PIECES_DIR/$wheel" "$TARGET"
  rm -rf "$PIECES_DIR"
  link_siblings
  timeout 400 "$PYTHON" -m bench.cudnn_check ours cudnn_9_19 cudnn_9_27
}

case ${1:-} in
  stage) stage ;;
  install) (($# == 2)) || die "usage: $0 install .cudnn/cN" && install "$2" ;;
  *) die "usage: $0 stage | install .cudnn/cN" ;;
esac
