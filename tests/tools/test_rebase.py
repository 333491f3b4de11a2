"""Rebase: one small real upstream with a v2.0.0 that makes each status happen."""
import json
from pathlib import Path

import pytest
from conftest import UPSTREAM_FILES, commit_in_tree, git, header, make_upstream

from tools.cli import main

MERGE_ME = "".join(f"m{i} = {i}\n" for i in range(1, 21))
V1 = {**UPSTREAM_FILES, "python/sglang/srt/merge_me.py": MERGE_ME}
SA = UPSTREAM_FILES["python/sglang/srt/server_args.py"]
V2 = {
    **V1,
    "python/sglang/srt/server_args.py": "# new\n# upstream\n# lines\n" + SA,
    "python/sglang/srt/merge_me.py": MERGE_ME.replace("m8 = 8\n", "m8 = 80\n"),
    "python/sglang/srt/nonl.txt": "first\nLAST",
    "python/sglang/srt/delete_me.py": "gone = 'maybe'\n",
}
del V2["python/sglang/srt/old_name.py"]
EXPECTED = {
    "a-exact.patch": "exact",
    "b-offset.patch": "offset (refreshed)",
    "c-merged.patch": "3-way merged (refreshed)",
    "d-upstream.patch": "already upstream",
    "e-obsolete.patch": "obsolete",
    "f-conflict.patch": "conflict",
}


@pytest.fixture
def proj(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    up = make_upstream(tmp_path / "up", V1, "v1.0.0")
    root = tmp_path / "proj"
    (root / "patches").mkdir(parents=True)
    (root / "series").write_text("# the series\n")
    monkeypatch.setenv("SGLANG_REPO", str(up))
    assert main(["--root", str(root), "--ref", "v1.0.0", "apply"]) == 0
    tree = root / "build/sglang-v1.0.0"
    edits = [
        ("A exact", {"python/sglang/srt/crlf.txt": "ALPHA\r\nbeta\r\ngamma\r\n"}),
        ("B offset", {"python/sglang/srt/server_args.py": SA.replace("x20 = 20\n", "x20 = 2000\n")}),
        ("C merged", {"python/sglang/srt/merge_me.py": MERGE_ME.replace("m10 = 10\n", "m10 = 1000\n")}),
        ("D upstream", {"python/sglang/srt/nonl.txt": "first\nLAST"}),
        ("E obsolete", {"python/sglang/srt/old_name.py": V1["python/sglang/srt/old_name.py"].replace("1", "5")}),
        ("F conflict", {"python/sglang/srt/delete_me.py": "gone = False\n"}),
    ]
    for subject, e in edits:
        commit_in_tree(tree, header(subject), e)
    assert main(["--root", str(root), "refresh"]) == 0
    (tmp_path / "up/python/sglang/srt/old_name.py").unlink()
    make_upstream(tmp_path / "up", V2, "v2.0.0")
    return root


def tool(root: Path, *a: str) -> int:
    return main(["--root", str(root), *a])


def snapshot(root: Path) -> dict[str, bytes]:
    files = [root / "series", root / "sglang.lock", *sorted((root / "patches").iterdir())]
    return {str(p): p.read_bytes() for p in files}


def test_check_classifies_every_status_and_changes_nothing(proj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(proj)
    assert tool(proj, "rebase", "--to", "v2.0.0", "--check") == 1  # a conflict
    out = capsys.readouterr().out
    for name, status in EXPECTED.items():
        assert f"| {name} | {status} |" in out, name
    assert "files gone upstream: python/sglang/srt/old_name.py" in out
    assert "conflicts in python/sglang/srt/delete_me.py" in out or "| f-conflict.patch | conflict |" in out
    assert "## Range-diff" in out and "A exact" in out
    assert snapshot(proj) == before
    assert (proj / "build/rebase-v2.0.0.md").read_text().startswith("# Rebase report: v1.0.0 -> v2.0.0")


def test_roll_needs_drop_then_updates_everything(proj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (proj / "series").write_text((proj / "series").read_text().replace("f-conflict.patch\n", ""))
    (proj / "patches/f-conflict.patch").unlink()
    before = snapshot(proj)
    assert tool(proj, "rebase", "--to", "v2.0.0") == 1
    assert "d-upstream.patch (already upstream), e-obsolete.patch (obsolete) would leave it" in capsys.readouterr().err
    assert snapshot(proj) == before
    assert tool(proj, "rebase", "--to", "v2.0.0", "--drop") == 0
    assert (proj / "series").read_text() == "# the series\na-exact.patch\nb-offset.patch\nc-merged.patch\n"
    assert not (proj / "patches/d-upstream.patch").exists()
    assert json.loads((proj / "sglang.lock").read_text())["ref"] == "v2.0.0"
    b = (proj / "patches/b-offset.patch").read_text()
    assert "@@ -20,7 +20,7 @@" in b and "Applies-To: v1.0.0, v2.0.0\n" in b
    # the rolled series is consistent: it applies exactly at the new pin and re-exports unchanged
    assert tool(proj, "apply") == 0
    assert tool(proj, "check") == 0
    capsys.readouterr()
    assert tool(proj, "status", "--refs", "v1.0.0") == 0
    out = capsys.readouterr().out
    assert "| patch | v2.0.0 (pinned) | v1.0.0 |" in out
    assert "| b-offset.patch | exact | offset -3 (1/1 hunks) |" in out


def test_conflict_stops_then_continue(proj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(proj)
    assert tool(proj, "rebase", "--to", "v2.0.0") == 1
    err = capsys.readouterr().err
    assert "Stopped at f-conflict.patch: resolve the conflicts in" in err and "CONTINUE=1" in err
    assert snapshot(proj) == before
    rt = proj / "build/rebase-v2.0.0"
    (rt / "python/sglang/srt/delete_me.py").write_text("gone = False\n")
    git(rt, "add", "-A")
    assert tool(proj, "rebase", "--to", "v2.0.0", "--continue", "--drop") == 0
    assert "| f-conflict.patch | conflict resolved by hand |" in capsys.readouterr().out
    assert json.loads((proj / "sglang.lock").read_text())["ref"] == "v2.0.0"
    assert "+gone = False" in (proj / "patches/f-conflict.patch").read_text()
    assert tool(proj, "apply") == 0


def test_abort(proj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(proj)
    assert tool(proj, "rebase", "--to", "v2.0.0") == 1
    assert tool(proj, "rebase", "--to", "v2.0.0") == 1
    assert "is in progress" in capsys.readouterr().err
    assert tool(proj, "rebase", "--to", "v2.0.0", "--abort") == 0
    assert not (proj / "build/rebase-v2.0.0").exists()
    assert snapshot(proj) == before
