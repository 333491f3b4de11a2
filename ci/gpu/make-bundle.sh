#!/bin/bash
# Builds the offline bundle (.gpu) for a GPU machine without network from a line's patched tree,
# and stamps it with the series it holds (`make bundle` runs `make check` first, so the tree's
# commits are the patches).
#   bash ci/gpu/make-bundle.sh [REF [TREE]]   # REF: a line (default: the ref pinned in sglang.lock);
#                                             # TREE: default build/sglang-<REF>
# The wheel list is lines/<REF>/gpu-wheels.txt for a line kept under lines/, else ci/gpu/wheels.txt.
# BUNDLE_SCRIPT: another builder taking DEST TREE WHEELS (default ci/gpu/build-bundle.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
pinned=$(sed -n 's/.*"ref": *"\([^"]*\)".*/\1/p' sglang.lock)
ref="${1:-$pinned}"
tree="${2:-build/sglang-$ref}"
if [ "$ref" = "$pinned" ]; then wheels=ci/gpu/wheels.txt; else wheels="lines/$ref/gpu-wheels.txt"; fi
[ "$ref" = "$pinned" ] || [ -d "lines/$ref" ] || { echo "make-bundle: no line $ref (lines/ holds: $(ls lines | tr '\n' ' '))" >&2; exit 2; }
[ -f "$wheels" ] || { echo "make-bundle: the line $ref has no GPU wheel list ($wheels): it is CPU-tested only" >&2; exit 2; }
[ -d "$tree/python/sglang" ] || { echo "make-bundle: no patched tree at $tree: run make apply SGLANG_REF=$ref first" >&2; exit 2; }
if [ -n "$(git -C "$tree" status --porcelain --untracked-files=no)" ]; then
  echo "make-bundle: $tree has uncommitted changes; commit them and make refresh, so the bundle is the series" >&2
  exit 2
fi
bash "${BUNDLE_SCRIPT:-ci/gpu/build-bundle.sh}" .gpu "$tree" "$wheels"
echo "$ref" > .gpu/line
bash ci/gpu/patches-stamp.sh "$ref" > .gpu/patches.sha256
echo "make-bundle: .gpu holds $tree (line $ref), series stamp $(cat .gpu/patches.sha256)"
