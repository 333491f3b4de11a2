"""Every package the toolkit imports is pinned in ci/requirements.txt (a fresh CI machine has only
what that file installs)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIST_OF = {"git": "GitPython"}  # import name -> distribution name, where they differ


def _imported(package: Path) -> set[str]:
    names: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"tools", "__future__"}


def test_every_third_party_import_of_the_toolkit_is_pinned() -> None:
    pins = {
        m.group(1).lower()
        for m in re.finditer(r"^([A-Za-z0-9_.-]+)==", (ROOT / "ci/requirements.txt").read_text(), re.M)
    }
    missing = sorted(n for n in _imported(ROOT / "tools") if DIST_OF.get(n, n).lower() not in pins)
    assert not missing, f"imported by tools/ but not pinned in ci/requirements.txt: {missing}"
