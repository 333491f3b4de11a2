import shutil
from pathlib import Path

import pytest

from conftest import DATA, Env, commit_in_tree, git, header

ALL_GOOD = ["exact.patch", "crlf-file.patch", "no-newline.patch", "rename.patch", "create-delete.patch"]


def test_apply_builds_base_ref_and_one_commit_per_patch(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.use(*ALL_GOOD)
    assert env.tool("apply") == 0
    t = env.tree
    subjects = git(t, "log", "--reverse", "--format=%s", "refs/patches/base..HEAD").splitlines()
    assert subjects == [
        "Change x20 in server args",
        "Edit a CRLF file",
        "Change the last line of a file without final newline",
        "Rename old_name to new_name",
        "Create one file and delete another",
    ]
    assert git(t, "rev-parse", "refs/patches/base") == git(t, "rev-parse", "upstream/v1.0.0")
    assert git(t, "rev-parse", "--abbrev-ref", "HEAD") == "patched"
    assert (t / "python/sglang/srt/crlf.txt").read_bytes() == b"alpha\r\nBETA\r\ngamma\r\n"
    assert (t / "python/sglang/srt/nonl.txt").read_bytes() == b"first\nLAST"
    assert not (t / "python/sglang/srt/delete_me.py").exists()
    # the commit message is the patch header (fields and free text), author is the constant
    msg = git(t, "log", "-1", "--format=%B", "HEAD~3")
    assert "Anchors: keep this free-text line" in msg and "Upstream-Status: not upstream" in msg
    err = capsys.readouterr().err
    assert "[5/5] applying create-delete.patch" in err


def test_same_series_gives_same_commit_ids(env: Env, tmp_path: Path) -> None:
    env.use("exact.patch")
    assert env.tool("apply") == 0
    first = git(env.tree, "rev-parse", "HEAD")
    other = tmp_path / "other-tree"
    assert env.tool("--tree", str(other), "apply") == 0
    assert git(other, "rev-parse", "HEAD") == first


def test_all_failures_reported_and_tree_untouched(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.use("exact.patch")
    assert env.tool("apply") == 0
    head = git(env.tree, "rev-parse", "HEAD")
    env.use("fuzz.patch", "no-newline.patch", "crlf-file.patch")
    (env.root / "patches" / "crlf-file.patch").write_bytes(
        (DATA / "crlf-file.patch").read_bytes().replace(b"-beta\r\n", b"-bet\r\n")
    )
    assert env.tool("apply") == 1
    err = capsys.readouterr().err
    assert (
        "fuzz.patch: python/sglang/srt/server_args.py: hunk @@ -17,7 +17,7 @@ x16 = 16: would only apply with fuzz 1"
        in err
    )
    assert (
        "crlf-file.patch: python/sglang/srt/crlf.txt: hunk @@ -1,3 +1,3 @@: does not apply at line 2: context differs"
        in err
    )
    assert "expected: 'bet\\r\\n'\n    actual:   'beta\\r\\n'" in err
    assert "2 of 3 patch(es) do not apply exactly at v1.0.0: fuzz.patch, crlf-file.patch" in err
    assert "was not changed" in err
    assert git(env.tree, "rev-parse", "HEAD") == head


def test_failed_fresh_apply_leaves_no_tree(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.rmtree(env.tree)
    env.use("fuzz.patch")
    assert env.tool("apply") == 1
    assert "No tree was created" in capsys.readouterr().err
    assert not env.tree.exists()
    assert not list((env.root / "build").glob(".apply-*"))


def test_offset_refused_by_default_and_allowed_on_request(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.use("offset.patch")
    assert env.tool("apply") == 1
    err = capsys.readouterr().err
    assert (
        "offset.patch: python/sglang/srt/server_args.py: hunk @@ -12,7 +12,7 @@ x16 = 16: applies 5 line(s) below"
        in err
    )
    assert "--allow-offset accepts them" in err
    assert env.tool("apply", "--allow-offset") == 0
    assert "x20 = 2000\n" in (env.tree / "python/sglang/srt/server_args.py").read_text()


def test_dirty_tree_refused_then_forced_with_backup(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    (env.tree / "python/sglang/__init__.py").write_text("work in progress\n")
    (env.tree / "python/sglang/new_file.py").write_text("new\n")
    assert env.tool("apply") == 3
    err = capsys.readouterr().err
    assert "uncommitted changes: python/sglang/__init__.py, python/sglang/new_file.py" in err
    assert "make refresh" in err and "FORCE=1" in err
    assert (env.tree / "python/sglang/__init__.py").read_text() == "work in progress\n"
    assert env.tool("apply", "--force") == 0
    out = capsys.readouterr().out
    branch = out.split("previous work saved on branch ")[1].split()[0]
    assert branch.startswith("backup/")
    assert git(env.tree, "show", f"{branch}:python/sglang/__init__.py") == "work in progress"
    assert git(env.tree, "show", f"{branch}:python/sglang/new_file.py") == "new"
    assert (env.tree / "python/sglang/__init__.py").read_text() == '__version__ = "1.0.0"\n'
    assert not (env.tree / "python/sglang/new_file.py").exists()


def test_commit_not_in_series_refused(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    commit_in_tree(env.tree, header("My unexported work"), {"python/sglang/x.py": "x = 1\n"})
    assert env.tool("apply") == 3
    assert "1 commit(s) not in the series: My unexported work" in capsys.readouterr().err


def test_series_entry_without_file_and_unparsable_patch(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.use("exact.patch", "broken.patch")
    (env.root / "series").write_text("exact.patch\nbroken.patch\nghost.patch\n")
    head = git(env.tree, "rev-parse", "HEAD")
    assert env.tool("apply") == 1
    err = capsys.readouterr().err
    assert "series:3: ghost.patch has no file patches/ghost.patch; add the file or remove the line" in err
    assert "broken.patch: " in err
    assert git(env.tree, "rev-parse", "HEAD") == head


def test_crlf_mangled_patch(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.use("crlf-mangled.patch")
    assert env.tool("apply") == 1
    assert "CRLF (Windows) line endings throughout" in capsys.readouterr().err


def test_a_patch_without_index_lines_is_refused(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    # exact.patch with its index line deleted and an added line edited by hand: without the blob ids
    # nothing would tell the edit from what refresh wrote.
    env.use("no-index-edited.patch")
    head = git(env.tree, "rev-parse", "HEAD")
    assert env.tool("apply") == 1
    err = capsys.readouterr().err
    assert (
        "no-index-edited.patch: python/sglang/srt/server_args.py: no full `index <old>..<new>` line" in err
        and "make refresh" in err
    )
    assert git(env.tree, "rev-parse", "HEAD") == head


def test_a_duplicate_series_entry_is_one_problem(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.use("exact.patch", "no-newline.patch")
    (env.root / "series").write_text("exact.patch\nno-newline.patch\nexact.patch\n")
    assert env.tool("apply") == 1
    err = capsys.readouterr().err
    assert "series:3: exact.patch is listed twice (first on line 1); remove one" in err
    assert "hunk" not in err.split("listed twice", 1)[1].split("\n", 1)[1]  # no second copy's hunks
    assert err.count("\n") <= 6, err


def test_a_hunk_in_the_way_of_an_earlier_patch_names_it(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.use("exact.patch")
    # Written against upstream's file, as exact.patch is: both change x20.
    rival = (DATA / "exact.patch").read_text().replace("+x20 = 2000", "+x20 = 21")
    (env.root / "patches" / "rival.patch").write_text(rival)
    (env.root / "series").write_text("exact.patch\nrival.patch\n")
    assert env.tool("apply") == 1
    err = capsys.readouterr().err
    assert (
        "rival.patch: python/sglang/srt/server_args.py: hunk @@ -17,7 +17,7 @@ x16 = 16" in err
        and "exact.patch changes python/sglang/srt/server_args.py earlier in the series; the hunk applies "
        "exactly to the base's file, so it conflicts with that change"
        in err
    ), err
