"""Release lines: lines/<ref>/ beside the default line, made by `rebase --new-line`, applied,
checked and listed by ref, the default line untouched throughout."""

import json
from pathlib import Path

import pytest

from tools.cli import main
from tools.lines import retarget_tests
from tools.project import Project

from conftest import UPSTREAM_FILES, commit_in_tree, git, header, make_upstream

SA = UPSTREAM_FILES["python/sglang/srt/server_args.py"]
V2 = {**UPSTREAM_FILES, "python/sglang/srt/server_args.py": "# v2\n" + SA}
V3 = {**V2, "python/sglang/srt/server_args.py": V2["python/sglang/srt/server_args.py"].replace("x3 = 3\n", "x3 = 33\n")}


def tool(root: Path, *a: str) -> int:
    return main(["--root", str(root), *a])


def snapshot(root: Path) -> dict[str, bytes]:
    files = [
        root / "series",
        root / "sglang.lock",
        *sorted((root / "patches").iterdir()),
        *sorted((root / "tests/patches").iterdir()),
    ]
    return {str(p): p.read_bytes() for p in files}


@pytest.fixture
def proj(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A default line pinned at v1.0.0 with one patch (and its CPU test); v2.0.0 and v3.0.0 upstream."""
    up = make_upstream(tmp_path / "up", UPSTREAM_FILES, "v1.0.0")
    root = tmp_path / "proj"
    (root / "patches").mkdir(parents=True)
    (root / "series").write_text("")
    (root / "tests/patches").mkdir(parents=True)
    (root / "tests/patches/test_x.py").write_text("def test_x():\n    pass\n")
    for shared in ("cpu_harness.py", "sglang_cpu.py", "spec_v2_cpu.py", "verify_cpu.py"):
        (root / "tests/patches" / shared).write_text("# shared by every line\n")
    monkeypatch.setenv("SGLANG_REPO", str(up))
    assert tool(root, "--ref", "v1.0.0", "apply") == 0
    commit_in_tree(
        root / "build/sglang-v1.0.0",
        header("knob"),
        {"python/sglang/srt/server_args.py": SA.replace("x10 = 10\n", "x10 = 100\n")},
    )
    assert tool(root, "refresh") == 0
    make_upstream(up, V2, "v2.0.0")
    make_upstream(up, V3, "v3.0.0")
    return root


def test_new_line_ports_a_copy_and_leaves_the_default_line(proj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(proj)
    assert tool(proj, "rebase", "--to", "v2.0.0", "--new-line") == 0
    line = proj / "lines/v2.0.0"
    assert json.loads((line / "sglang.lock").read_text())["ref"] == "v2.0.0"
    assert (line / "series").read_text() == (proj / "series").read_text()
    patch = (line / "patches/knob.patch").read_text()
    assert " lines/v2.0.0/tests/patches/test_x.py::test_x" in patch, "the copy tests with its own copy"
    assert (line / "tests/patches/test_x.py").is_file()
    for shared in ("cpu_harness.py", "sglang_cpu.py", "spec_v2_cpu.py", "verify_cpu.py"):
        assert not (line / "tests/patches" / shared).exists(), f"a copy of {shared} would shadow the shared one"
    assert snapshot(proj) == before
    assert json.loads((proj / "sglang.lock").read_text())["ref"] == "v1.0.0"

    # both lines build and check from the one checkout
    assert tool(proj, "--ref", "v2.0.0", "apply") == 0
    assert git(proj / "build/sglang-v2.0.0", "log", "-1", "--format=%s").strip() == "knob"
    assert tool(proj, "apply") == 0 and (proj / "build/sglang-v1.0.0").is_dir()
    capsys.readouterr()
    assert tool(proj, "check") == 0
    out = capsys.readouterr()
    assert "2 line(s)" in out.out and "== line lines/v2.0.0" in out.err
    assert tool(proj, "status") == 0
    status = capsys.readouterr().out
    assert "### line ." in status and "### line lines/v2.0.0" in status and "| patch | v2.0.0 (pinned) |" in status


def test_a_line_made_from_another_line(proj: Path) -> None:
    assert tool(proj, "rebase", "--to", "v2.0.0", "--new-line") == 0
    assert tool(proj, "--ref", "v2.0.0", "rebase", "--to", "v3.0.0", "--new-line") == 0
    patch = (proj / "lines/v3.0.0/patches/knob.patch").read_text()
    assert " lines/v3.0.0/tests/patches/test_x.py::test_x" in patch and "lines/v2.0.0" not in patch
    assert json.loads((proj / "lines/v2.0.0/sglang.lock").read_text())["ref"] == "v2.0.0"
    assert [p.line for p in Project(proj).all_lines()] == [None, "v2.0.0", "v3.0.0"]


def test_an_existing_line_is_not_overwritten(proj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tool(proj, "rebase", "--to", "v2.0.0", "--new-line") == 0
    lock = (proj / "lines/v2.0.0/sglang.lock").read_bytes()
    capsys.readouterr()
    assert tool(proj, "rebase", "--to", "v2.0.0", "--new-line") == 2
    assert "lines/v2.0.0 exists already" in capsys.readouterr().err
    assert (proj / "lines/v2.0.0/sglang.lock").read_bytes() == lock
    assert tool(proj, "rebase", "--to", "v1.0.0", "--new-line") == 2
    assert "at v1.0.0 already" in capsys.readouterr().err
    assert not (proj / "lines/v1.0.0").exists()


def test_a_conflicted_new_line_continues_or_is_discarded_on_abort(
    proj: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(proj)
    commit_in_tree(
        proj / "build/sglang-v1.0.0",
        header("clash"),
        {"python/sglang/srt/server_args.py": SA.replace("x10 = 10\n", "x10 = 100\n").replace("x3 = 3\n", "x3 = 300\n")},
    )
    assert tool(proj, "refresh") == 0
    before = snapshot(proj)
    assert tool(proj, "rebase", "--to", "v3.0.0", "--new-line") == 1
    err = capsys.readouterr().err
    assert "Stopped at clash.patch" in err and "lines/v3.0.0 holds the copy being ported" in err
    assert (proj / "lines/v3.0.0").is_dir(), "kept while the conflict waits"
    assert tool(proj, "rebase", "--to", "v3.0.0", "--abort") == 0
    assert "never reached v3.0.0" in capsys.readouterr().err
    assert not (proj / "lines/v3.0.0").exists() and snapshot(proj) == before


def test_retarget_touches_the_header_only() -> None:
    text = "Subject: x\nTests:\n tests/patches/test_a.py::t\n---\ndiff --git a/f b/f\n tests/patches/kept\n"
    out = retarget_tests(text, "tests/", "lines/v2/tests/")
    assert " lines/v2/tests/patches/test_a.py::t\n---\n" in out and out.endswith(" tests/patches/kept\n")


def test_a_line_is_not_moved_to_another_release(proj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tool(proj, "rebase", "--to", "v2.0.0", "--new-line") == 0
    capsys.readouterr()
    assert tool(proj, "--ref", "v2.0.0", "rebase", "--to", "v3.0.0") == 2
    assert "NEW_LINE=1" in capsys.readouterr().err
    assert json.loads((proj / "lines/v2.0.0/sglang.lock").read_text())["ref"] == "v2.0.0"


def test_a_line_with_its_own_requirements_tests_in_its_own_python(
    proj: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os
    import sys

    assert tool(proj, "rebase", "--to", "v2.0.0", "--new-line") == 0
    assert tool(proj, "--ref", "v2.0.0", "apply") == 0
    (proj / "lines/v2.0.0/requirements.txt").write_text("sglang==2.0.0\n")
    capsys.readouterr()
    assert tool(proj, "--ref", "v2.0.0", "test", "--patches-only") == 1
    assert "bash ci/bootstrap-venv.sh lines/v2.0.0/requirements.txt .venv-v2.0.0" in capsys.readouterr().err
    venv_python = proj / ".venv-v2.0.0/bin/python"
    venv_python.parent.mkdir(parents=True)
    os.symlink(sys.executable, venv_python)
    assert tool(proj, "--ref", "v2.0.0", "test", "--patches-only") == 0
    err = capsys.readouterr().err
    assert f"{venv_python} -m pytest -q lines/v2.0.0/tests/patches/test_x.py::test_x" in err
    assert "lines/v2.0.0/tests/gpu does not exist" in err


def test_a_report_on_the_default_line_while_the_new_line_exists(proj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tool(proj, "rebase", "--to", "v2.0.0", "--new-line") == 0
    capsys.readouterr()
    assert tool(proj, "rebase", "--to", "v2.0.0", "--check") == 0
    assert (proj / "docs/rebase/v2.0.0.md").read_text().startswith("# Rebase report: v1.0.0 -> v2.0.0")


def test_a_lines_report_stays_under_its_name(proj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tool(proj, "rebase", "--to", "v2.0.0", "--new-line") == 0
    assert tool(proj, "rebase", "--to", "v3.0.0", "--check") == 0
    default_report = (proj / "docs/rebase/v3.0.0.md").read_bytes()
    # The line v2.0.0 ported to the same release: its report and its build beside the default line's.
    assert tool(proj, "--ref", "v2.0.0", "rebase", "--to", "v3.0.0", "--check") == 0
    assert (proj / "docs/rebase/v3.0.0.md").read_bytes() == default_report
    assert (proj / "docs/rebase/v2.0.0/v3.0.0.md").read_text().startswith("# Rebase report: v2.0.0 -> v3.0.0")
    assert "report written to" in capsys.readouterr().err
    assert (proj / "build/rebase-v3.0.0").is_dir() and (proj / "build/rebase-v2.0.0-to-v3.0.0").is_dir()
