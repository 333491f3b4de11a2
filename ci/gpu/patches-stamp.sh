#!/bin/bash
# Prints the identity of a line's patch series (its series file and every patch file).
#   usage: patches-stamp.sh [DIR]     (the line's folder, as `python -m tools line dir` names it;
#                                      default: the checkout's root, the default line)
# make-bundle.sh stamps it into .gpu/patches.sha256; run-on-device.sh refuses a bundle whose stamp
# differs, so a device run never tests a tree built from other patches than this checkout's.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir="${1:-.}"
[ -f "$dir/series" ] || { echo "patches-stamp: no series in $dir" >&2; exit 2; }
cat "$dir/series" "$dir"/patches/*.patch | sha256sum | cut -d' ' -f1
