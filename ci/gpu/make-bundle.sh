#!/bin/bash
# Builds the offline bundle for the lent H200 (.gpu) from the patched tree and stamps it with the
# series it holds (`make bundle` runs `make check` first, so the tree's commits are the patches).
#   bash ci/gpu/make-bundle.sh [TREE]      # default: build/sglang-<ref pinned in sglang.lock>
# BUNDLE_SCRIPT: the shared bundle builder (default ../shared/gpu/build-bundle.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
ref=$(sed -n 's/.*"ref": *"\([^"]*\)".*/\1/p' sglang.lock)
tree="${1:-build/sglang-$ref}"
script="${BUNDLE_SCRIPT:-../shared/gpu/build-bundle.sh}"
[ -d "$tree/python/sglang" ] || { echo "make-bundle: no patched tree at $tree: run make apply first" >&2; exit 2; }
[ -f "$script" ] || { echo "make-bundle: no bundle builder at $script: set BUNDLE_SCRIPT" >&2; exit 2; }
if [ -n "$(git -C "$tree" status --porcelain --untracked-files=no)" ]; then
  echo "make-bundle: $tree has uncommitted changes; commit them and make refresh, so the bundle is the series" >&2
  exit 2
fi
bash "$script" .gpu "$tree"
bash ci/gpu/patches-stamp.sh > .gpu/patches.sha256
echo "make-bundle: .gpu holds $tree, series stamp $(cat .gpu/patches.sha256)"
