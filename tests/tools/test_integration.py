"""Against the real SGLang 0.5.9 sdist from PyPI (cached in the project's .cache/ after the first run)."""

import json
import os
import shutil
from pathlib import Path

import pytest

from tools.cli import main
from tools.project import DEFAULT_INDEX_URL
from tools.upstream import pypi_dist

from conftest import DATA, REAL_ROOT, git

pytestmark = pytest.mark.network

SHA = "11b1445bfb039c20217783850fda66a71b814391b2cf313f4e6cadc3b9fea41b"


@pytest.fixture
def real_proj(tmp_path: Path, real_sdist: Path) -> Path:
    root = tmp_path / "proj"
    (root / "patches").mkdir(parents=True)
    (root / ".cache/sglang/archives").mkdir(parents=True)
    os.link(real_sdist, root / ".cache/sglang/archives" / real_sdist.name)
    shutil.copy(REAL_ROOT / "sglang.lock", root / "sglang.lock")
    shutil.copy(DATA / "sglang-0.5.9-demo.patch", root / "patches/demo.patch")
    (root / "series").write_text("demo.patch\n")
    return root


def test_pypi_index_has_the_pinned_sdist() -> None:
    d = pypi_dist("0.5.9", DEFAULT_INDEX_URL)
    assert (d.filename, d.sha256, d.kind) == ("sglang-0.5.9.tar.gz", SHA, "pypi-sdist")


def test_lock_pins_the_pypi_sdist() -> None:
    lock = json.loads((REAL_ROOT / "sglang.lock").read_text())
    assert lock["source"] == "pypi-sdist" and lock["sha256"] == SHA


def test_real_apply_refresh_check(real_proj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def tool(*a: str) -> int:
        return main(["--root", str(real_proj), *a])

    assert tool("apply") == 0
    tree = real_proj / "build/sglang-v0.5.9"
    assert (tree / "python/sglang/srt/server_args.py").read_text().count("import logging  # patched") == 1
    assert (tree / "python/pyproject.toml").exists()
    # the base commit is reproducible: it is the one the committed lock records
    lock = json.loads((real_proj / "sglang.lock").read_text())
    assert git(tree, "rev-parse", "refs/patches/base") == lock["base_commit"]
    assert tool("refresh") == 0
    assert (real_proj / "patches/demo.patch").read_bytes() == (DATA / "sglang-0.5.9-demo.patch").read_bytes()
    assert tool("check") == 0
    capsys.readouterr()
    assert tool("status") == 0
    assert "| demo.patch | exact | v0.5.9 | not upstream |" in capsys.readouterr().out
