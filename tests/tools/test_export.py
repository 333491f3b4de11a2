import pytest

from tools.export import canonical, slug

from conftest import DATA, Env, commit_in_tree, git, header

ALL_GOOD = ["exact.patch", "crlf-file.patch", "no-newline.patch", "rename.patch", "create-delete.patch"]


def test_apply_then_refresh_is_byte_for_byte_noop(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.use(*ALL_GOOD)
    assert env.tool("apply") == 0
    assert env.tool("refresh") == 0
    assert "refresh: 0 written, 5 unchanged, 0 new" in capsys.readouterr().out
    for n in ALL_GOOD:
        assert (env.root / "patches" / n).read_bytes() == (DATA / n).read_bytes(), n


def _amend_crlf_patch(env: Env, middle: bytes) -> None:
    """Change the crlf-file patch in the tree, as a developer folds in a fix."""
    (env.tree / "python/sglang/srt/crlf.txt").write_bytes(b"alpha\r\n" + middle + b"\r\ngamma\r\n")
    git(env.tree, "commit", "-q", "-a", "--amend", "--no-edit")


def test_refresh_writes_a_changed_patch_keeping_its_header(env: Env) -> None:
    env.use("crlf-file.patch")
    assert env.tool("apply") == 0
    _amend_crlf_patch(env, b"BETA!")
    assert env.tool("refresh") == 0
    new = (env.root / "patches" / "crlf-file.patch").read_bytes()
    old = (DATA / "crlf-file.patch").read_bytes()
    assert new.split(b"---\n")[0] == old.split(b"---\n")[0]  # header byte for byte
    assert b"+BETA!\r\n" in new


def test_new_commit_becomes_new_patch_in_series(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.use("exact.patch")
    assert env.tool("apply") == 0
    commit_in_tree(env.tree, header("Add a knob: --foo (v2)"), {"python/sglang/knob.py": "foo = 1\n"})
    assert env.tool("refresh") == 0
    assert (env.root / "series").read_text().endswith("exact.patch\nadd-a-knob-foo-v2.patch\n")
    text = (env.root / "patches" / "add-a-knob-foo-v2.patch").read_text()
    # author/date of the developer's commit are normalised, the separator is "---"
    assert text.startswith(
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: sglang-patches <sglang-patches@invalid>\nDate: Thu, 1 Jan 2026 00:00:00 +0000\n"
        "Subject: [PATCH] Add a knob: --foo (v2)\n\nDescription:\n"
    )
    assert "python/sglang/knob.py::x\n---\ndiff --git" not in text and "---\ndiff --git a/python/sglang/knob.py" in text
    # the tree is now "in the series": apply no longer refuses
    assert env.tool("apply") == 0


def test_a_numbered_series_numbers_the_new_patch(env: Env) -> None:
    env.use("exact.patch")
    (env.root / "patches" / "exact.patch").rename(env.root / "patches" / "0007-exact.patch")
    (env.root / "series").write_text("0007-exact.patch\n")
    assert env.tool("apply") == 0
    commit_in_tree(env.tree, header("Add a knob: --foo (v2)"), {"python/sglang/knob.py": "foo = 1\n"})
    assert env.tool("refresh") == 0
    assert (env.root / "series").read_text() == "0007-exact.patch\n0008-add-a-knob-foo-v2.patch\n"
    assert (env.root / "patches" / "0008-add-a-knob-foo-v2.patch").is_file()


def test_header_problems_warned_on_refresh(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    commit_in_tree(env.tree, "Quick hack\n", {"python/sglang/hack.py": "x = 1\n"})
    assert env.tool("refresh") == 0
    assert "quick-hack.patch: header lacks required field Description:" in capsys.readouterr().err


def test_dropped_commit_is_not_silently_lost(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.use("exact.patch", "no-newline.patch")
    assert env.tool("apply") == 0
    git(env.tree, "reset", "-q", "--hard", "HEAD~1")
    assert env.tool("refresh") == 1
    assert "series entries with no commit in the tree: no-newline.patch" in capsys.readouterr().err


def test_hand_edited_patch_file_is_not_overwritten(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.use("exact.patch", "no-newline.patch")
    assert env.tool("apply") == 0
    patch = env.root / "patches" / "exact.patch"
    edited = patch.read_text().replace("Description:\n", "Description:\n An edit made in patches/.\n", 1)
    assert edited != patch.read_text()
    patch.write_text(edited)
    assert env.tool("refresh") == 1
    err = capsys.readouterr().err
    assert "patch files edited since the tree was last applied or refreshed: exact.patch" in err
    assert "Nothing was written" in err
    assert patch.read_text() == edited
    # FORCE=1 takes the tree's version, on purpose.
    assert env.tool("refresh", "--force") == 0
    assert patch.read_bytes() == (DATA / "exact.patch").read_bytes()


def test_refresh_after_refresh_sees_no_edit(env: Env) -> None:
    env.use("crlf-file.patch")
    assert env.tool("apply") == 0
    _amend_crlf_patch(env, b"BETA!")
    assert env.tool("refresh") == 0
    _amend_crlf_patch(env, b"BETA?")
    assert env.tool("refresh") == 0
    assert b"+BETA?\r\n" in (env.root / "patches" / "crlf-file.patch").read_bytes()


def test_canonical_is_idempotent_and_slug() -> None:
    text = (DATA / "exact.patch").read_text()
    assert canonical(text) == text
    blank_sep = text.replace("---\ndiff --git", "\ndiff --git", 1)
    assert canonical(blank_sep) == text
    assert slug("Fix: SM120 gate (communicator.py)!") == "fix-sm120-gate-communicator-py.patch"
