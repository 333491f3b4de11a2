#!/bin/bash
# Prints the identity of a line's patch series (its series file and every patch file).
#   usage: patches-stamp.sh [REF]     (no REF, or the ref pinned in sglang.lock: the default line)
# make-bundle.sh stamps it into .gpu/patches.sha256; run-on-device.sh refuses a bundle whose stamp
# differs, so a device run never tests a tree built from other patches than this checkout's.
set -euo pipefail
cd "$(dirname "$0")/../.."
ref="${1:-}"
if [ -n "$ref" ] && [ -d "lines/$ref" ]; then dir="lines/$ref"; else dir=.; fi
cat "$dir/series" "$dir"/patches/*.patch | sha256sum | cut -d' ' -f1
