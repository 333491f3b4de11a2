#!/bin/bash
# Builds an offline bundle that runs a patched SGLang tree on a GPU machine without network access
# (Python 3.12 with torch and triton installed; the wheels it lacks travel in the bundle).
#   usage: build-bundle.sh DEST TREE WHEELS
# WHEELS: pip pins, one per line ('#' comments), of the pure and py3.12 wheels the machine lacks.
# Two entries are special: 'sglang-kernel==X' (unpacked with only its sm90 ops: FA3 and sm100 are
# far too large to travel) and the word 'sgl-kernel-compat' (the tree's SGLang imports names the
# carried sglang-kernel no longer exports: they resolve to functions that raise when called), and
# 'stub-package:NAME' (a package too large to travel that SGLang imports without using it on the paths
# the bundle serves: a stand-in, stub_package.py, whose every use raises).
# DEST gets whl/, sglk.tar.xz, setup.sh (run it on the GPU machine) and tree.tar.xz (TREE's python/).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="${1:?usage: build-bundle.sh DEST TREE WHEELS}"
tree="${2:?usage: build-bundle.sh DEST TREE WHEELS}"
wheels="${3:?usage: build-bundle.sh DEST TREE WHEELS}"
[ -f "$wheels" ] || { echo "build-bundle: no wheel list at $wheels" >&2; exit 2; }
pins=$(sed 's/#.*//; s/[[:space:]]//g; /^$/d' "$wheels")
kernel=$(grep '^sglang-kernel==' <<<"$pins" || true)
[ -n "$kernel" ] || { echo "build-bundle: $wheels names no sglang-kernel==<version>" >&2; exit 2; }
plat=()
for n in 34 31 28 27 24 17 5; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
fetch() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" "$@"; }

rm -rf "$dest" && mkdir -p "$dest/whl"
dest="$(cd "$dest" && pwd)"
grep -v -e '^sglang-kernel==' -e '^sgl-kernel-compat$' -e '^stub-package:' <<<"$pins" > "$dest/whl/requirements.txt"
fetch -d "$dest/whl" -r "$dest/whl/requirements.txt"
rm "$dest/whl/requirements.txt"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fetch -d "$tmp" "$kernel"
(cd "$tmp" && python3 -m zipfile -e sglang_kernel-*.whl x >/dev/null \
   && rm -rf x/sgl_kernel/flash_ops* x/sgl_kernel/flashmla_ops* x/sgl_kernel/sm100 \
   && tar cJf "$dest/sglk.tar.xz" -C x sgl_kernel)
cp "$here/bundle-setup.sh" "$dest/setup.sh"
if grep -qx 'sgl-kernel-compat' <<<"$pins"; then cp "$here/sgl_kernel_compat.py" "$dest/"; fi
for stub in $(sed -n 's/^stub-package://p' <<<"$pins"); do
  mkdir -p "$dest/stubs/$stub" && cp "$here/stub_package.py" "$dest/stubs/$stub/__init__.py"
done
# multimodal_gen: SGLang's diffusion runtime, which the LLM server never imports (about 1 MB of the bundle).
tar cJf "$dest/tree.tar.xz" -C "$tree" --exclude='__pycache__' --exclude='python/sglang/multimodal_gen' python
du -sh "$dest"
