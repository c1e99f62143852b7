#!/usr/bin/env bash
# The image build's first step: every pin of versions.txt that names something upstream is looked up there before
# any long step runs, so a pin that does not exist stops the build in its first minutes, with one line naming it.
#
#   bash tools/image/check_pins.sh KIND PIN VALUE [WHERE...] [KIND PIN VALUE [WHERE...]]...
#
# Kinds (WHERE is what the build itself later downloads from):
#   set        PIN VALUE                 VALUE is not empty (pins that name nothing upstream)
#   git-tag    PIN TAG REPO              REPO has the tag TAG (git ls-remote)
#   git-commit PIN SHA REPO              REPO serves the full commit SHA (shallow fetch by hash, as the build does)
#   url        PIN VALUE URL             URL serves its first byte (a ranged GET, redirects followed)
#   apt        PIN VALUE REPO PACKAGE    the flat apt repository REPO lists PACKAGE (its Packages.gz)
#
# Knobs:
#   PIN_CHECK_TIMEOUT  seconds each look-up may take (default: 60)
set -euo pipefail

PIN_CHECK_TIMEOUT=${PIN_CHECK_TIMEOUT:-60}
FAILED=0

usage_error() {
  echo "check_pins.sh: $*" >&2
  exit 2
}

# One line per pin that fails, naming it and where it was looked for; the build stops after all are checked.
fail() {
  echo "pin $1=$2: $3" >&2
  FAILED=1
}

git_tag() {
  local pin=$1 tag=$2 repo=$3
  timeout "$PIN_CHECK_TIMEOUT" git ls-remote --exit-code --tags "$repo" "refs/tags/$tag" >/dev/null 2>&1 ||
    fail "$pin" "$tag" "no tag $tag in $repo"
}

git_commit() {
  local pin=$1 sha=$2 repo=$3 scratch
  [[ $sha =~ ^[0-9a-f]{40}$ ]] || {
    fail "$pin" "$sha" "not a full 40-digit commit hash"
    return
  }
  scratch=$(mktemp -d)
  git init -q "$scratch"
  timeout "$PIN_CHECK_TIMEOUT" git -C "$scratch" fetch -q --depth 1 "$repo" "$sha" >/dev/null 2>&1 ||
    fail "$pin" "$sha" "commit $sha not found in $repo"
  rm -rf "$scratch"
}

# A GET of the first byte, as the build's own download would start: a HEAD request can be refused where the GET is
# served (the signed URLs that GitHub redirects release assets to are signed for one method).
url() {
  local pin=$1 value=$2 where=$3
  curl -fsL --range 0-0 --max-time "$PIN_CHECK_TIMEOUT" -o /dev/null "$where" || fail "$pin" "$value" "no $where"
}

apt_package() {
  local pin=$1 value=$2 repo=$3 package=$4 index
  index=$(curl -fsSL --max-time "$PIN_CHECK_TIMEOUT" "$repo/Packages.gz" | gzip -dc) || {
    fail "$pin" "$value" "cannot read $repo/Packages.gz"
    return
  }
  grep -qx "Package: $package" <<<"$index" || fail "$pin" "$value" "no package $package in $repo"
}

main() {
  [[ $# -gt 0 ]] || usage_error "no pins to check"
  while [[ $# -gt 0 ]]; do
    local kind=$1 arity
    case "$kind" in
      set) arity=3 ;;
      git-tag | git-commit | url) arity=4 ;;
      apt) arity=5 ;;
      *) usage_error "unknown kind '$kind' (want set, git-tag, git-commit, url or apt)" ;;
    esac
    [[ $# -ge $arity ]] || usage_error "$kind needs $((arity - 1)) arguments"
    local pin=$2 value=$3
    if [[ -z $value ]]; then
      fail "$pin" "" "empty: pass the [image] pins of versions.txt (make build does)"
    else
      case "$kind" in
        set) ;;
        git-tag) git_tag "$pin" "$value" "$4" ;;
        git-commit) git_commit "$pin" "$value" "$4" ;;
        url) url "$pin" "$value" "$4" ;;
        apt) apt_package "$pin" "$value" "$4" "$5" ;;
      esac
    fi
    shift "$arity"
  done
  exit "$FAILED"
}

main "$@"
