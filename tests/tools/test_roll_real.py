"""Roll the real series (plus a demo patch) from v0.5.9 to v0.5.10 (PyPI sdist) in a scratch
project: every patch must port, and each patch's CPU tests must pass on the rolled tree."""
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import DATA, REAL_ROOT

from tools.cli import main
from tools.project import DEFAULT_INDEX_URL
from tools.series import read_series

pytestmark = pytest.mark.network

DEMO_TEST = '''
import os
from pathlib import Path


def test_marker():
    src = Path(os.environ["SGLANG_TREE"], "python/sglang/srt/server_args.py").read_text()
    assert "import logging  # patched" in src
'''


def test_roll_series_to_v0_5_10(tmp_path: Path, real_sdist: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SGLANG_INDEX_URL", DEFAULT_INDEX_URL)
    root = tmp_path / "proj"
    (root / ".cache/sglang").mkdir(parents=True)
    # share the real project's download cache (archives and base commits) so CI downloads once
    real_cache = REAL_ROOT / ".cache/sglang/archives"
    real_cache.mkdir(parents=True, exist_ok=True)
    os.symlink(real_cache, root / ".cache/sglang/archives")
    shutil.copy(REAL_ROOT / "sglang.lock", root / "sglang.lock")
    if (REAL_ROOT / "patches").is_dir():
        shutil.copytree(REAL_ROOT / "patches", root / "patches")
    else:
        (root / "patches").mkdir()
    names = read_series(REAL_ROOT / "series").names if (REAL_ROOT / "series").exists() else []
    shutil.copy(DATA / "sglang-0.5.9-demo.patch", root / "patches/zz-toolkit-demo.patch")
    (root / "series").write_text("".join(f"{n}\n" for n in names + ["zz-toolkit-demo.patch"]))
    if (REAL_ROOT / "tests/patches").is_dir():
        shutil.copytree(REAL_ROOT / "tests/patches", root / "tests/patches")
    (root / "tests/patches").mkdir(parents=True, exist_ok=True)
    (root / "tests/patches/test_toolkit_demo.py").write_text(DEMO_TEST)

    def tool(*a: str) -> int:
        return main(["--root", str(root), *a])

    rc = tool("rebase", "--to", "v0.5.10")
    report = capsys.readouterr().out
    assert rc == 0, report
    for n in names + ["zz-toolkit-demo.patch"]:
        assert any(f"| {n} | {s}" in report for s in ("exact", "offset", "3-way merged")), (n, report)
    assert json.loads((root / "sglang.lock").read_text())["ref"] == "v0.5.10"
    assert tool("apply") == 0
    assert tool("check") == 0
    assert tool("test", "--patches-only") == 0, capsys.readouterr().err
