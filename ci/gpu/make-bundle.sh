#!/bin/bash
# Builds the offline bundle (.gpu) for a GPU machine without network from a line's patched tree,
# and stamps it with the series it holds (`make bundle` runs `make check` first, so the tree's
# commits are the patches).
#   bash ci/gpu/make-bundle.sh [REF [TREE]]   # REF: a line (default: the ref pinned in sglang.lock);
#                                             # TREE: default build/sglang-<REF>
# The line's ref, folder and wheel list come from the toolkit (`python -m tools line`), as make's do.
# PYTHON: the Python with the toolkit's packages (default .venv/bin/python, as make sets it up).
# BUNDLE_SCRIPT: another builder taking DEST TREE WHEELS (default ci/gpu/build-bundle.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
line() { "${PYTHON:-.venv/bin/python}" -m tools ${1:+--ref "$1"} line "$2"; }
ref=$(line "${1:-}" ref) || { echo "make-bundle: the toolkit could not name the line ${1:-}" >&2; exit 2; }
dir=$(line "$ref" dir)
pinned=$(line "" ref)
tree="${2:-$(line "$ref" tree)}"
wheels=$(realpath --relative-to=. "$(line "$ref" gpu-wheels)")
line_dir=$(realpath --relative-to=. "$dir")
[ "$ref" = "$pinned" ] || [ "$line_dir" != . ] || { echo "make-bundle: no line $ref (lines/ holds: $(ls lines | tr '\n' ' '))" >&2; exit 2; }
[ -f "$wheels" ] || { echo "make-bundle: the line $ref has no GPU wheel list ($wheels): it is CPU-tested only" >&2; exit 2; }
[ -d "$tree/python/sglang" ] || { echo "make-bundle: no patched tree at $tree: run make apply SGLANG_REF=$ref first" >&2; exit 2; }
if [ -n "$(git -C "$tree" status --porcelain --untracked-files=no)" ]; then
  echo "make-bundle: $tree has uncommitted changes; commit them and make refresh, so the bundle is the series" >&2
  exit 2
fi
bash "${BUNDLE_SCRIPT:-ci/gpu/build-bundle.sh}" .gpu "$tree" "$wheels"
echo "$ref" > .gpu/line
echo "$line_dir" > .gpu/line-dir
bash ci/gpu/patches-stamp.sh "$line_dir" > .gpu/patches.sha256
echo "make-bundle: .gpu holds $tree (line $ref), series stamp $(cat .gpu/patches.sha256)"
