#!/usr/bin/env bash
# `make`'s set-up step: create .venv and install ci/requirements.txt into it, when .venv is missing
# or the requirements changed since it was installed (their sha256 is kept in .venv). pip does the
# work, so the user's own index configuration (PIP_INDEX_URL, pip.conf, netrc) applies.
#   bash ci/bootstrap-venv.sh [REQUIREMENTS VENV]: a release line's environment on top of .venv,
#     e.g. lines/<ref>/requirements.txt into .venv-<ref>. It holds only what the line pins otherwise
#     (its SGLang release imports another transformers) and sees the rest in .venv through a .pth
#     file: torch with its CUDA libraries takes about 6 GB, and once is enough.
#   BOOTSTRAP_PYTHON: the Python that creates .venv (default: the first of python3.11, python3.12,
#                     python3.13, python3 on PATH that is 3.11.4 or newer)
set -euo pipefail
cd "$(dirname "$0")/.."
base=.venv
req=${1:-ci/requirements.txt}
venv=${2:-$base}
[ -f "$req" ] || { echo "setup: $req does not exist" >&2; exit 2; }

install() {  # REQUIREMENTS VENV DIGEST HINT: install, then stamp VENV with DIGEST (HINT ends the first message)
  echo "[setup] installing $1 into $2$4"
  # pip's downloads wait in a temporary folder until all are installed (about 3 GB for torch's
  # CUDA wheels): keep it beside the environment, not in a /tmp that may be a small tmpfs.
  mkdir -p "$2/.pip-tmp"
  if ! TMPDIR="$(cd "$2" && pwd)/.pip-tmp" "$2/bin/python" -m pip install --quiet --disable-pip-version-check -r "$1"; then
    rm -rf "$2/.pip-tmp"
    echo "setup: pip could not install $1 into $2 (no network, no package index reachable, or no disk space?)." >&2
    echo "  pip's own configuration applies (PIP_INDEX_URL, pip.conf); or run make with PYTHON=<a Python that has them>." >&2
    exit 2
  fi
  rm -rf "$2/.pip-tmp"
  echo "$3" > "$2/.requirements.sha256"
  echo "[setup] $2 is ready"
}

current() {  # is VENV there, stamped with DIGEST?
  [ -x "$1/bin/python" ] && [ "$(cat "$1/.requirements.sha256" 2>/dev/null)" = "$2" ]
}

if [ "$venv" != "$base" ]; then
  # A line's layer: .venv first, then the line's pins over it (restamped when either changes).
  bash ci/bootstrap-venv.sh
  want=$(cat "$req" "$base/.requirements.sha256" | sha256sum | cut -d' ' -f1)
  current "$venv" "$want" && exit 0
  site_of() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
  if [ -x "$venv/bin/python" ] && [ ! -f "$(site_of "$venv")/_base_venv.pth" ]; then
    # Made before lines were layered: it holds a whole copy of .venv's packages. Nothing in it is
    # the user's (the set-up step made it), so it is made again, over .venv.
    echo "[setup] $venv holds its own copy of every package; making it again over $base"
    rm -rf "$venv"
  fi
  if [ ! -x "$venv/bin/python" ]; then
    echo "[setup] creating $venv over $base"
    "$base/bin/python" -m venv "$venv"
  fi
  site_of "$base" > "$(site_of "$venv")/_base_venv.pth"
  install "$req" "$venv" "$want" ""
  exit 0
fi

want=$(sha256sum "$req" | cut -d' ' -f1)
current "$venv" "$want" && exit 0
# 3.11.4: SGLang's archives are unpacked with tarfile's extraction filters, new in 3.11.4 (Debian 12's
# python3.11 is 3.11.2).
new_enough() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11, 4))' 2>/dev/null; }
if [ ! -x "$venv/bin/python" ]; then
  py=${BOOTSTRAP_PYTHON:-}
  tried=""
  if [ -z "$py" ]; then
    for c in python3.11 python3.12 python3.13 python3; do
      command -v "$c" >/dev/null || continue
      if new_enough "$c"; then py=$c; break; fi
      tried="$tried $c ($("$c" -V 2>&1))"
    done
    if [ -z "$py" ] && [ -n "$tried" ]; then
      echo "setup: no Python 3.11.4 or newer on PATH (found:$tried); install one or set BOOTSTRAP_PYTHON" >&2
      exit 2
    fi
  fi
  if [ -z "$py" ] || ! command -v "$py" >/dev/null; then
    echo "setup: no Python found (${py:-none of python3.11/3.12/3.13/python3 on PATH}); install Python 3.11.4+ or set BOOTSTRAP_PYTHON" >&2
    exit 2
  fi
  if ! new_enough "$py"; then
    echo "setup: $py is $("$py" -V 2>&1), the toolkit needs Python 3.11.4 or newer: set BOOTSTRAP_PYTHON" >&2
    exit 2
  fi
  echo "[setup] creating $venv with $py ($("$py" -V 2>&1))"
  "$py" -m venv "$venv"
fi
install "$req" "$venv" "$want" " (the first time takes minutes: torch is large)"
