"""The real series, with 0007 cut between two of its hunks (what `head -n` of the file gives), against
the real 0.5.9 sdist: apply and check call it damaged and leave nothing built."""

import os
import shutil
from pathlib import Path

import pytest

from tools.cli import main

from conftest import REAL_ROOT

pytestmark = pytest.mark.network
DAMAGED = "0007-plain-decode-graphs.patch"


def _cut_after_hunks(text: str, keep: int) -> str:
    lines = text.split("\n")
    hunks = [i for i, ln in enumerate(lines) if ln.startswith("@@ ")]
    return "\n".join(lines[: hunks[keep]]) + "\n"


def test_real_patch_cut_between_hunks_is_refused(
    tmp_path: Path, real_sdist: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "proj"
    (root / ".cache/sglang").mkdir(parents=True)
    os.symlink(real_sdist.parent, root / ".cache/sglang/archives")  # the shared download cache
    for name in ("sglang.lock", "series"):
        shutil.copy(REAL_ROOT / name, root / name)
    shutil.copytree(REAL_ROOT / "patches", root / "patches")
    path = root / "patches" / DAMAGED
    path.write_text(_cut_after_hunks(path.read_text(), 5))

    assert main(["--root", str(root), "apply"]) == 1
    err = capsys.readouterr().err
    assert f"{DAMAGED}: python/sglang/srt/model_executor/cuda_graph_runner.py: damaged: after the patch" in err
    assert "No tree was created." in err and not (root / "build/sglang-v0.5.9").exists()
    assert main(["--root", str(root), "check"]) == 1
    out = capsys.readouterr().out
    assert f"{DAMAGED}: python/sglang/srt/model_executor/cuda_graph_runner.py: damaged" in out
    assert "re-export would change the file" not in out
