"""The CPU test harness every line's patch tests share, set up by each line's conftest.py.

The tree is `$SGLANG_TREE` (a folder holding `python/sglang`), which `python -m tools test` sets to
the series applied up to the patch under test; by default the line's full tree from `make apply`.
Only the native `sgl_kernel` library is stood in for (stubs/), and only when it is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch

STUBS = Path(__file__).resolve().parent / "stubs"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
_tree_in_use: Path | None = None


def _default_tree(line_dir: Path) -> Path:
    """build/sglang-<ref>, the tree `make apply` builds for the ref the line's lock pins."""
    lock = line_dir / "sglang.lock"
    ref = json.loads(lock.read_text(encoding="utf-8"))["ref"] if lock.is_file() else "v0.5.9"
    return PROJECT_ROOT / "build" / f"sglang-{ref}"


def set_up(tests_dir: Path) -> Path:
    """Put the patched tree of the line whose tests are in tests_dir first on sys.path."""
    global _tree_in_use
    line_dir = tests_dir.resolve().parents[1]
    tree = Path(os.environ.get("SGLANG_TREE") or _default_tree(line_dir)).resolve()
    if not (tree / "python" / "sglang" / "__init__.py").is_file():
        raise pytest.UsageError(
            f"no patched SGLang tree at {tree}: run `make apply` first, "
            "or point SGLANG_TREE at a tree that holds python/sglang"
        )
    sys.path.insert(0, str(tree / "python"))
    if importlib.util.find_spec("sgl_kernel") is None or not torch.cuda.is_available():
        # Without a GPU an installed sgl_kernel fails to load its CUDA library at import.
        sys.path.insert(0, str(STUBS))
    os.environ.setdefault("SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK", "1")
    _tree_in_use = tree
    return tree


def pytest_report_header(config: pytest.Config) -> str:
    return f"patched SGLang tree: {_tree_in_use}"


@pytest.fixture(scope="session", autouse=True)
def imported_sglang_is_the_tree() -> None:
    import sglang

    imported = Path(sglang.__file__).resolve()
    if _tree_in_use is None or _tree_in_use not in imported.parents:
        pytest.exit(
            f"imported sglang from {imported}, not from the patched tree {_tree_in_use}; "
            "uninstall the other sglang or fix PYTHONPATH",
            returncode=3,
        )
