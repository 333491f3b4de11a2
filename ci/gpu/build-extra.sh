#!/bin/bash
# Optional: wheels for the device that its image lacks, into .gpu/extra/ (installed by
# run-on-device.sh). The H200 image already has pytest and matplotlib (device KINDS.md), so this
# is only for another GPU box. Keep .gpu plus the project under 64 MiB: matplotlib with its
# dependencies is ~20 MB; pytest ~2 MB.
#   usage: ci/gpu/build-extra.sh [pytest] [matplotlib]      (default: pytest)
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=.gpu/extra
mkdir -p "$dest"
want=("${@:-pytest}")
pkgs=()
for w in "${want[@]}"; do
  case "$w" in
    pytest) pkgs+=(pytest==9.2.0 pluggy==1.6.0 iniconfig==2.1.0 packaging==25.0 pygments==2.19.2) ;;
    matplotlib) pkgs+=(matplotlib==3.11.2 contourpy cycler fonttools kiwisolver pillow pyparsing python-dateutil six) ;;
    *) echo "unknown: $w (pytest | matplotlib)" >&2; exit 2 ;;
  esac
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$dest" "${pkgs[@]}"
du -sh "$dest"
