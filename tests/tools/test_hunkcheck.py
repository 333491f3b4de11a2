from pathlib import Path

from tools.hunkcheck import HunkStatus, TreeState, check_patch, check_series, split_lines
from tools.patchfile import read_patch

from conftest import UPSTREAM_FILES

DATA = Path(__file__).parent / "data"


def state(files: dict[str, str] = UPSTREAM_FILES) -> TreeState:
    files = dict(files)
    return TreeState(lambda p: files.get(p))


def one(name: str, st: TreeState | None = None):
    return check_patch(read_patch(DATA / name), st or state())


def test_split_lines_only_on_lf() -> None:
    assert split_lines("a\x0cb\r\nc") == ["a\x0cb\r\n", "c"]


def test_exact() -> None:
    r = one("exact.patch")
    assert r.status is HunkStatus.EXACT and r.hunks[0].line == 17


def test_offset_is_reported_with_lines() -> None:
    (h,) = one("offset.patch").hunks
    assert h.status is HunkStatus.OFFSET and h.offset == 5 and h.label == "offset +5"
    msg = h.describe()
    assert "offset.patch: python/sglang/srt/server_args.py: hunk @@ -12,7 +12,7 @@" in msg
    assert "5 line(s) below where it says (line 12 -> 17)" in msg


def test_fuzz_is_named_with_expected_and_actual() -> None:
    (h,) = one("fuzz.patch").hunks
    assert h.status is HunkStatus.FUZZ and h.fuzz == 1
    msg = h.describe()
    assert "would only apply with fuzz 1 at line 17" in msg
    assert "'x17 = 17  # upstream changed this line\\n'" in msg and "'x17 = 17\\n'" in msg


def test_failed_names_line_expected_actual() -> None:
    files = dict(UPSTREAM_FILES)
    files["python/sglang/srt/server_args.py"] = files["python/sglang/srt/server_args.py"].replace(
        "x20 = 20\n", "x20 = 21\n"
    )
    (h,) = one("exact.patch", state(files)).hunks
    assert h.status is HunkStatus.FAILED and h.line == 20
    assert h.expected == "x20 = 20\n" and h.actual == "x20 = 21\n"
    assert "does not apply at line 20: context differs" in h.describe()


def test_crlf_patch_exact_on_crlf_file_and_named_on_lf_file() -> None:
    assert one("crlf-file.patch").status is HunkStatus.EXACT
    files = dict(UPSTREAM_FILES)
    files["python/sglang/srt/crlf.txt"] = "alpha\nbeta\ngamma\n"
    (h,) = one("crlf-file.patch", state(files)).hunks
    assert h.status is HunkStatus.FAILED and "line endings differ (CRLF vs LF)" in h.describe()


def test_no_newline_at_eof() -> None:
    assert one("no-newline.patch").status is HunkStatus.EXACT
    files = dict(UPSTREAM_FILES)
    files["python/sglang/srt/nonl.txt"] = "first\nlast\n"
    (h,) = one("no-newline.patch", state(files)).hunks
    assert h.status is HunkStatus.FAILED and "newline at end of file differs" in h.describe()


def test_rename_create_delete_and_sequencing() -> None:
    st = state()
    results = check_series([read_patch(DATA / "rename.patch"), read_patch(DATA / "create-delete.patch")], st)
    assert [r.status for r in results] == [HunkStatus.EXACT, HunkStatus.EXACT]
    assert st.get("python/sglang/srt/old_name.py") is None
    assert "return 3" in (st.get("python/sglang/srt/new_name.py") or "")
    assert st.get("python/sglang/srt/created.py") == "created = True\n"
    assert st.get("python/sglang/srt/delete_me.py") is None
    # applying the same patches again: the files they need are gone / already there
    again = check_series([read_patch(DATA / "rename.patch"), read_patch(DATA / "create-delete.patch")], st)
    notes = " ".join(h.describe() for r in again for h in r.hunks)
    assert "old_name.py does not exist in the tree" in notes
    assert "creates python/sglang/srt/created.py, which already exists" in notes


def test_cursor_forbids_matching_above_previous_hunk() -> None:
    # two identical hunks: the second must match below the first, not on the same lines again
    text = "a\nb\nc\nx\na\nb\nc\n"
    patch_text = (DATA / "exact.patch").read_text().split("diff --git")[0] + (
        "diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"
    )
    from tools.patchfile import parse_patch_text

    r = check_patch(parse_patch_text(patch_text, "twice.patch"), TreeState(lambda p: text))
    assert [h.label for h in r.hunks] == ["exact", "offset +4"]
