"""A patch that lost hunks never applies; apply reports every problem in one run; a diff cut
mid-hunk is located; requirements between patches are checked (issue: toolkit integrity)."""

from pathlib import Path

import pytest

from tools.errors import PatchParseError
from tools.hunkcheck import HunkStatus, TreeState, check_patch
from tools.patchfile import parse_patch_text, read_patch

from conftest import DATA, Env, git


def _reader(upstream: Path):
    return lambda path: (upstream / path).read_text() if (upstream / path).exists() else None


def test_whole_patch_applies_and_its_index_line_holds(env: Env) -> None:
    result = check_patch(read_patch(DATA / "three-hunks.patch"), TreeState(_reader(env.upstream)))
    assert [h.status for h in result.hunks] == [HunkStatus.EXACT] * 3


def test_patch_cut_between_hunks_is_damaged(env: Env) -> None:
    patch = read_patch(DATA / "truncated-between-hunks.patch")
    result = check_patch(patch, TreeState(_reader(env.upstream)))
    (damage,) = [h for h in result.hunks if h.status is HunkStatus.DAMAGED]
    assert damage.expected == patch.files[0].new_blob
    text = damage.describe()
    assert "truncated-between-hunks.patch: python/sglang/srt/server_args.py: damaged" in text
    actual, expected = damage.actual, patch.files[0].new_blob
    assert actual and expected and actual in text and expected in text  # both blob ids
    assert "damaged or was edited by hand" in text


def test_apply_refuses_a_truncated_patch_and_keeps_the_tree(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.use("three-hunks.patch")
    assert env.tool("apply") == 0
    head = git(env.tree, "rev-parse", "HEAD")
    (env.root / "patches" / "three-hunks.patch").write_bytes((DATA / "truncated-between-hunks.patch").read_bytes())
    assert env.tool("apply", "--force") == 1
    err = capsys.readouterr().err
    assert "three-hunks.patch: python/sglang/srt/server_args.py: damaged" in err
    assert "damaged: three-hunks.patch" in err
    assert git(env.tree, "rev-parse", "HEAD") == head


def test_check_calls_a_truncated_patch_damaged_not_unformatted(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.use("three-hunks.patch")
    (env.root / "patches" / "three-hunks.patch").write_bytes((DATA / "truncated-between-hunks.patch").read_bytes())
    assert env.tool("check") == 1
    out = capsys.readouterr().out
    assert "damaged" in out
    assert "re-export would change the file" not in out


def test_refresh_says_how_many_hunks_the_file_would_lose(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.use("truncated-between-hunks.patch")
    (env.root / "patches" / "truncated-between-hunks.patch").write_bytes((DATA / "three-hunks.patch").read_bytes())
    assert env.tool("apply") == 0  # the tree holds all three hunks
    # The file on disk loses two of them (cut by hand): refreshing restores them.
    (env.root / "patches" / "truncated-between-hunks.patch").write_bytes(
        (DATA / "truncated-between-hunks.patch").read_bytes()
    )
    assert env.tool("refresh") == 1
    assert (
        "truncated-between-hunks.patch: the file has 1 hunk(s), the tree's commit 3 (FORCE=1 writes the tree's 3)"
    ) in capsys.readouterr().err


def test_apply_reports_every_problem_in_one_run(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.use("exact.patch", "crlf-mangled.patch", "broken.patch", "fuzz.patch")
    (env.root / "series").write_text("fuzz.patch\nghost.patch\ncrlf-mangled.patch\nbroken.patch\nexact.patch\n")
    assert env.tool("apply") == 1
    err = capsys.readouterr().err
    assert "fuzz.patch: " in err and "fuzz" in err.split("fuzz.patch: ", 1)[1]
    assert "series:2: ghost.patch has no file patches/ghost.patch" in err
    assert "crlf-mangled.patch: the file has CRLF (Windows) line endings" in err
    assert "broken.patch: " in err
    # exact.patch comes after patches that could not be read: the tree it meets is unknown, so it
    # is named once instead of reading as an offset or a conflict.
    assert "exact.patch: " not in err
    assert (
        err.strip()
        .splitlines()[-2]
        .endswith(
            "1 later patch(es) not checked against the tree (exact.patch): they build on a patch that could not be "
            "read; fix that one first"
        )
    )


def test_a_diff_cut_mid_hunk_names_the_file_the_hunk_and_the_line() -> None:
    with pytest.raises(PatchParseError) as e:
        read_patch(DATA / "truncated-mid-hunk.patch")
    assert str(e.value) == (
        "truncated-mid-hunk.patch: the diff does not parse: python/sglang/srt/server_args.py: hunk "
        "@@ -17,7 +17,7 @@ x16 = 16 (line 29) ends at line 31 with 5 old / 5 new line(s) still to come: "
        "the patch is truncated or was edited by hand"
    )
    lines = (DATA / "truncated-mid-hunk.patch").read_text().split("\n")
    assert lines[28].startswith("@@ -17,7 +17,7 @@") and lines[30] == " x18 = 18"


def test_requires_must_name_an_earlier_patch(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    text = (DATA / "exact.patch").read_text().replace("Tests:", "Requires: no-newline.patch\nTests:")
    env.use("exact.patch", "no-newline.patch")
    (env.root / "patches" / "exact.patch").write_text(text)
    assert parse_patch_text(text, "exact.patch").requires == ["no-newline.patch"]
    assert env.tool("check") == 1
    assert "exact.patch: Requires no-newline.patch, which is later in series" in capsys.readouterr().out
    (env.root / "series").write_text("no-newline.patch\nexact.patch\n")
    assert env.tool("apply") == 0
