#!/bin/bash
# Runs on the GPU machine (build-bundle.sh copies it into the bundle as setup.sh): installs the
# bundle's wheels and kernel library into /tmp/site, once per machine and bundle, and unpacks the
# patched tree into /tmp/sgltree. Then:
#   export PYTHONPATH=/tmp/sgltree/python:/tmp/site SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
set -e
cd "$(dirname "$0")"
key=$( (cat setup.sh; cat sgl_kernel_compat.py 2>/dev/null; ls whl stubs 2>/dev/null) | md5sum | cut -c1-12)
if [ ! -f "/tmp/site/.done-$key" ]; then
  rm -rf /tmp/site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site whl/*.whl
  tar xJf sglk.tar.xz -C /tmp/site
  # A blank line first: the kernel package's __init__.py may not end in a newline.
  if [ -f sgl_kernel_compat.py ]; then { echo; cat sgl_kernel_compat.py; } >> /tmp/site/sgl_kernel/__init__.py; fi
  if [ -d stubs ]; then cp -r stubs/. /tmp/site/; fi
  touch "/tmp/site/.done-$key"
fi
rm -rf /tmp/sgltree && mkdir -p /tmp/sgltree && tar xJf tree.tar.xz -C /tmp/sgltree
