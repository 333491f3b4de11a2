"""No import cycles among the project's modules, counting imports inside functions and under
TYPE_CHECKING: a cycle hidden in a function still ties two modules into one."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tools", "bench")


def module_imports(path: Path, package: str) -> set[str]:
    """The project modules a file imports, wherever in the file the import statement sits."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's own package, one level up per extra dot
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            if base.split(".")[0] not in PACKAGES:
                continue
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] in PACKAGES)
    return found


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Every module of the packages and their subpackages, with the project modules it imports."""
    modules = {module_name(root, f): f for pkg in PACKAGES for f in sorted((root / pkg).rglob("*.py"))}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = {m for m in module_imports(path, package) if m in modules and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_project_has_no_import_cycle() -> None:
    graph = import_graph(ROOT)
    assert len(graph) > 40  # both packages were read
    assert cycles(graph) == []


@pytest.mark.parametrize(
    "hidden",
    [
        "def build():\n    from pkga import b\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkga.b import X\n",
    ],
)
def test_a_cycle_inside_a_function_or_for_types_is_found(
    tmp_path: Path, hidden: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pkga").mkdir()
    (tmp_path / "pkga" / "a.py").write_text(hidden)
    (tmp_path / "pkga" / "b.py").write_text("from pkga.a import build\n")
    (tmp_path / "pkga" / "c.py").write_text("import pkga.b\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGES", ("pkga",))
    assert cycles(import_graph(tmp_path)) == [["pkga.a", "pkga.b"]]


def test_a_cycle_between_subpackages_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for sub in ("run", "results"):
        (tmp_path / "pkga" / sub).mkdir(parents=True)
        (tmp_path / "pkga" / sub / "__init__.py").write_text("")
    (tmp_path / "pkga" / "run" / "server.py").write_text("from pkga.results import records\n")
    (tmp_path / "pkga" / "results" / "records.py").write_text("from ..run.server import X\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGES", ("pkga",))
    assert cycles(import_graph(tmp_path)) == [["pkga.results.records", "pkga.run.server"]]
