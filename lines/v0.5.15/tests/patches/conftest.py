"""CPU test harness for the patched SGLang tree.

The tree is `$SGLANG_TREE` (a folder holding `python/sglang`), which `python -m tools test` sets to
the series applied up to the patch under test; by default the full tree from `make apply`.
Only the native `sgl_kernel` library is stood in for, and only when it is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
# This harness is copied into each release line (lines/<ref>/tests/patches) and finds its own:
# the line's folder holds the lock, the checkout root holds build/.
LINE_DIR = HERE.parents[1]
PROJECT_ROOT = LINE_DIR.parents[1] if LINE_DIR.parent.name == "lines" else LINE_DIR
STUBS = HERE / "stubs"
# What every line's harness shares whatever its release (kernel_refs.py); after the line's own folder,
# so a line's sglang_cpu.py is the one its tests import.
sys.path.append(str(PROJECT_ROOT / "tests" / "patches"))


def _default_tree() -> Path:
    """build/sglang-<ref>, the tree `make apply` builds for the ref this line's lock pins."""
    lock = LINE_DIR / "sglang.lock"
    ref = json.loads(lock.read_text(encoding="utf-8"))["ref"] if lock.is_file() else "v0.5.9"
    return PROJECT_ROOT / "build" / f"sglang-{ref}"


def _tree() -> Path:
    tree = Path(os.environ.get("SGLANG_TREE") or _default_tree()).resolve()
    if not (tree / "python" / "sglang" / "__init__.py").is_file():
        raise pytest.UsageError(
            f"no patched SGLang tree at {tree}: run `make apply` first, "
            "or point SGLANG_TREE at a tree that holds python/sglang"
        )
    return tree


SGLANG_TREE = _tree()
sys.path.insert(0, str(SGLANG_TREE / "python"))
if importlib.util.find_spec("sgl_kernel") is None or not torch.cuda.is_available():
    # Without a GPU an installed sgl_kernel fails to load its CUDA library at import.
    sys.path.insert(0, str(STUBS))
os.environ.setdefault("SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK", "1")


def pytest_report_header(config):
    return f"patched SGLang tree: {SGLANG_TREE}"


@pytest.fixture(scope="session", autouse=True)
def _imported_sglang_is_the_tree():
    import sglang

    imported = Path(sglang.__file__).resolve()
    if SGLANG_TREE not in imported.parents:
        pytest.exit(
            f"imported sglang from {imported}, not from the patched tree {SGLANG_TREE}; "
            "uninstall the other sglang or fix PYTHONPATH",
            returncode=3,
        )
