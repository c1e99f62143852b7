#!/usr/bin/env bash
# Build the training image with docker, then export it as an enroot squash file that pyxis can start.
#
#   ./enroot.sh                                     # docker build -t megatron-lm:latest . -> ./megatron-lm+latest.sqsh
#   ./enroot.sh -n team/megatron:v1 -o /fsx/images  # -> /fsx/images/team+megatron+v1.sqsh
#   ./enroot.sh -n megatron-lm -- --build-arg CUDA_VERSION=13.0.2   # after --: passed to docker build unchanged
#
# `make build` runs this with every [image] pin of versions.txt after --.
set -euo pipefail

FILE="Dockerfile"    # -f: Dockerfile to build
INPUT="."            # -i: docker build context
OUTPUT="."           # -o: folder that receives the .sqsh
IMAGE="megatron-lm"  # -n: image name, optionally with :TAG (default tag: latest)
DOCKER_ARGS=()       # after --: extra docker build arguments

usage() {
  cat <<EOF
usage: $0 [-f DOCKERFILE] [-i CONTEXT] [-o OUTPUT_DIR] [-n NAME[:TAG]] [-- DOCKER_BUILD_ARGS...]

Build NAME:TAG with docker, then write OUTPUT_DIR/NAME+TAG.sqsh with enroot ('/' in NAME becomes '+').

  -h, --help            show this help
  -f, --file PATH       Dockerfile to build          [default: $FILE]
  -i, --input PATH      docker build context         [default: $INPUT]
  -o, --output PATH     folder for the .sqsh file    [default: $OUTPUT]
  -n, --image NAME[:TAG]  image name and tag         [default: $IMAGE:latest]
EOF
}

die() {
  echo "enroot.sh: $*" >&2
  exit 1
}

usage_error() {
  echo "enroot.sh: $*" >&2
  usage >&2
  exit 2
}

parse_args() {
  while [ $# -gt 0 ]; do
    case "$1" in
      -h | --help) usage; exit 0 ;;
      --) shift; DOCKER_ARGS=("$@"); return ;;
      -f | --file | -i | --input | -o | --output | -n | --image)
        if [ $# -lt 2 ] || [ -z "$2" ]; then usage_error "option $1 needs a value"; fi ;;&
      -f | --file) FILE="$2" ;;
      -i | --input) INPUT="$2" ;;
      -o | --output) OUTPUT="$2" ;;
      -n | --image) IMAGE="$2" ;;
      *) usage_error "unknown argument '$1'" ;;
    esac
    shift 2
  done
}

# NAME[:TAG] -> IMAGE_REF (NAME:TAG) and SQSH (OUTPUT/NAME+TAG.sqsh). A ':' before the last '/' is a registry port.
resolve_names() {
  local name="$IMAGE" tag="latest"
  if [[ "${IMAGE##*/}" == *:* ]]; then
    name="${IMAGE%:*}"
    tag="${IMAGE##*:}"
  fi
  if [ -z "$name" ] || [ -z "$tag" ]; then usage_error "bad image name '$IMAGE' (want NAME or NAME:TAG)"; fi
  IMAGE_REF="$name:$tag"
  SQSH="${OUTPUT%/}/${name//\//+}+$tag.sqsh"
}

check_inputs() {
  [ -f "$FILE" ] || die "no Dockerfile at '$FILE'"
  [ -d "$INPUT" ] || die "build context '$INPUT' is not a directory"
  [ -d "$OUTPUT" ] || die "output directory '$OUTPUT' does not exist"
  command -v docker >/dev/null || die "docker not found on PATH: build on a host with Docker installed"
  command -v enroot >/dev/null || die "enroot not found on PATH: build on a host with enroot installed (the pyxis nodes have it)"
}

# Print a command once, in a form that can be copied, then run it.
run() {
  echo "+$(printf ' %q' "$@")"
  "$@"
}

main() {
  parse_args "$@"
  resolve_names
  check_inputs
  run docker build -f "$FILE" -t "$IMAGE_REF" "${DOCKER_ARGS[@]}" "$INPUT" ||
    die "docker build of $IMAGE_REF failed; no squash file written"
  if [ -e "$SQSH" ]; then # enroot refuses to overwrite a file: one from an earlier build goes first
    echo "removing stale $SQSH"
    rm -f -- "$SQSH"
  fi
  run enroot import -o "$SQSH" "dockerd://$IMAGE_REF" || die "enroot import of $IMAGE_REF failed"
  echo "wrote $SQSH"
}

main "$@"
