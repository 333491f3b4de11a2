"""Fixtures: real git repositories in tmp_path, a tiny 'upstream' with the shapes real patches meet
(CRLF file, file without final newline, files to rename/delete), and a project around it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project root, for `import tools`

from tools.cli import main  # noqa: E402
from tools.project import Project  # noqa: E402

DATA = Path(__file__).parent / "data"
REAL_ROOT = Path(__file__).resolve().parents[2]
UNREACHABLE_INDEX = "http://127.0.0.1:9/simple"  # port 9 (discard): connection refused, fast
UNREACHABLE_REMOTE = "/nonexistent/sglang.git"

UPSTREAM_FILES = {
    "python/pyproject.toml": '[project]\nname = "sglang"\nversion = "1.0.0"\n',
    "python/sglang/__init__.py": '__version__ = "1.0.0"\n',
    "python/sglang/srt/server_args.py": "".join(f"x{i} = {i}\n" for i in range(1, 41)),
    "python/sglang/srt/crlf.txt": "alpha\r\nbeta\r\ngamma\r\n",
    "python/sglang/srt/nonl.txt": "first\nlast",
    "python/sglang/srt/old_name.py": "def f():\n    return 1\n\n\ndef g():\n    return 2\n",
    "python/sglang/srt/delete_me.py": "gone = True\n",
}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(autouse=True)
def hermetic_git(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path_factory.mktemp("gitcfg") / "config"
    cfg.write_text("[user]\n\tname = Dev\n\temail = dev@example.com\n[init]\n\tdefaultBranch = main\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(cfg))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("SGLANG_REMOTE", UNREACHABLE_REMOTE)
    monkeypatch.setenv("SGLANG_INDEX_URL", UNREACHABLE_INDEX)
    monkeypatch.delenv("SGLANG_REPO", raising=False)


def make_upstream(path: Path, files: dict[str, str] = UPSTREAM_FILES, tag: str = "v1.0.0") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if not (path / ".git").exists():
        git(path, "init", "-q")
    for rel, text in files.items():
        f = path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(text.encode())
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", f"upstream {tag}")
    git(path, "tag", tag)
    return path


@dataclass
class Env:
    root: Path
    upstream: Path
    project: Project

    def tool(self, *args: str) -> int:
        return main(["--root", str(self.root), *args])

    @property
    def tree(self) -> Path:
        return self.root / "build" / "sglang-v1.0.0"

    def use(self, *names: str) -> None:
        """Put data patches into the series (in order)."""
        (self.root / "patches").mkdir(exist_ok=True)
        for n in names:
            shutil.copy(DATA / n, self.root / "patches" / n)
        (self.root / "series").write_text("# test series\n" + "".join(f"{n}\n" for n in names))


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    upstream = make_upstream(tmp_path / "upstream")
    root = tmp_path / "project"
    (root / "patches").mkdir(parents=True)
    (root / "series").write_text("")
    monkeypatch.setenv("SGLANG_REPO", str(upstream))
    e = Env(root, upstream, Project(root))
    assert e.tool("--ref", "v1.0.0", "apply") == 0  # pins v1.0.0 in sglang.lock
    return e


def commit_in_tree(tree: Path, message: str, edits: Mapping[str, str | None]) -> None:
    for rel, text in edits.items():
        f = tree / rel
        if text is None:
            f.unlink()
        else:
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(text.encode())
    git(tree, "add", "-A")
    subprocess.run(["git", "commit", "-q", "-F", "-"], cwd=tree, input=message, text=True, check=True)


def header(subject: str, tests: str = "tests/patches/test_x.py::test_x", extra: str = "") -> str:
    return (
        f"{subject}\n\nDescription:\n Why this exists.\n .\n Second paragraph.\nApplies-To: v1.0.0\n"
        f"Upstream-Status: not upstream\nDrop-When: upstream fixes it\n{extra}Tests:\n {tests}\n"
    )


@pytest.fixture(scope="session")
def real_sdist() -> Path:
    """SGLang 0.5.9's sdist from PyPI, cached in the project's .cache/ (shared with `make apply`)."""
    from tools.upstream import download

    dest = REAL_ROOT / ".cache" / "sglang" / "archives" / "sglang-0.5.9.tar.gz"
    url = (
        "https://files.pythonhosted.org/packages/3b/a8/2e75eae9f5817510175c299016b9c2fc324d06a9fa56944322a2e731ef59/"
        "sglang-0.5.9.tar.gz"
    )
    try:
        return download(url, dest, "11b1445bfb039c20217783850fda66a71b814391b2cf313f4e6cadc3b9fea41b")
    except Exception as e:  # offline developer machine: the marker lets them deselect these
        pytest.fail(f"cannot get the real sdist ({e}); run with -m 'not network' offline")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "network: needs PyPI (real SGLang sdist); deselect offline with -m 'not network'"
    )
