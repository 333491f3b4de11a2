#!/bin/bash
# Prints the identity of the patch series (the series file and every patch file). make-bundle.sh
# stamps it into .gpu/patches.sha256; run-on-device.sh refuses a bundle whose stamp differs, so a
# device run never tests a tree built from other patches than the ones in this checkout.
set -euo pipefail
cd "$(dirname "$0")/../.."
cat series patches/*.patch | sha256sum | cut -d' ' -f1
