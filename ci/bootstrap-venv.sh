#!/usr/bin/env bash
# `make`'s set-up step: create .venv and install ci/requirements.txt into it, when .venv is missing
# or the requirements changed since it was installed (their sha256 is kept in .venv). pip does the
# work, so the user's own index configuration (PIP_INDEX_URL, pip.conf, netrc) applies.
#   bash ci/bootstrap-venv.sh [REQUIREMENTS VENV]: another environment, e.g. a release line's
#   (lines/<ref>/requirements.txt into .venv-<ref>: the SGLang release and the packages it imports).
#   BOOTSTRAP_PYTHON: the Python that creates .venv (default: the first of python3.11, python3.12,
#                     python3.13, python3 on PATH; 3.11 or newer)
set -euo pipefail
cd "$(dirname "$0")/.."
req=${1:-ci/requirements.txt}
venv=${2:-.venv}
[ -f "$req" ] || { echo "setup: $req does not exist" >&2; exit 2; }
stamp=$venv/.requirements.sha256
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
  py=${BOOTSTRAP_PYTHON:-}
  if [ -z "$py" ]; then
    for c in python3.11 python3.12 python3.13 python3; do
      if command -v "$c" >/dev/null; then py=$c; break; fi
    done
  fi
  if [ -z "$py" ] || ! command -v "$py" >/dev/null; then
    echo "setup: no Python found (${py:-none of python3.11/3.12/3.13/python3 on PATH}); install Python 3.11+ or set BOOTSTRAP_PYTHON" >&2
    exit 2
  fi
  if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "setup: $py is $("$py" -V 2>&1), the toolkit needs Python 3.11 or newer: set BOOTSTRAP_PYTHON" >&2
    exit 2
  fi
  echo "[setup] creating $venv with $py ($("$py" -V 2>&1))"
  "$py" -m venv "$venv"
fi
echo "[setup] installing $req into $venv (the first time takes minutes: torch is large)"
if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"; then
  echo "setup: pip could not install $req into $venv (no network, or no package index reachable?)." >&2
  echo "  pip's own configuration applies (PIP_INDEX_URL, pip.conf); or run make with PYTHON=<a Python that has them>." >&2
  exit 2
fi
echo "$want" > "$stamp"
echo "[setup] $venv is ready"
