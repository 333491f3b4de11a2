from pathlib import Path

import pytest

from tools.errors import PatchParseError
from tools.patchfile import parse_patch_text, read_patch

DATA = Path(__file__).parent / "data"


def test_header_fields_and_hunks() -> None:
    p = read_patch(DATA / "exact.patch")
    assert p.subject == "Change x20 in server args"
    assert p.fields["Description"] == "Why this exists.\n\nSecond paragraph."
    assert p.applies_to == ["v1.0.0"]
    assert p.upstream_status == "not upstream"
    assert p.tests == ["tests/patches/test_demo.py::test_x20"]
    assert p.missing_fields() == []
    (fp,) = p.files
    assert fp.source == fp.target == "python/sglang/srt/server_args.py"
    (h,) = fp.hunks
    assert h.header == "@@ -17,7 +17,7 @@ x16 = 16"
    assert h.old_lines[3] == "x20 = 20\n" and h.new_lines[3] == "x20 = 2000\n"
    assert p.header.endswith("---\n") and "diff --git" not in p.header


def test_free_text_kept_in_header() -> None:
    p = read_patch(DATA / "crlf-file.patch")
    assert "Anchors: keep this free-text line\n" in p.header


def test_no_newline_at_eof_lines_have_no_newline() -> None:
    (fp,) = read_patch(DATA / "no-newline.patch").files
    (h,) = fp.hunks
    assert h.old_lines == ["first\n", "last"] and h.new_lines == ["first\n", "LAST"]


def test_crlf_content_is_kept() -> None:
    (fp,) = read_patch(DATA / "crlf-file.patch").files
    assert fp.hunks[0].old_lines == ["alpha\r\n", "beta\r\n", "gamma\r\n"]


def test_rename_create_delete() -> None:
    (fp,) = read_patch(DATA / "rename.patch").files
    assert fp.is_rename and fp.source and fp.target
    assert fp.source.endswith("old_name.py") and fp.target.endswith("new_name.py")
    files = {(f.source, f.target) for f in read_patch(DATA / "create-delete.patch").files}
    assert ("python/sglang/srt/delete_me.py", None) in files
    assert (None, "python/sglang/srt/created.py") in files


def test_missing_field_named() -> None:
    p = read_patch(DATA / "missing-field.patch")
    assert p.header_problems() == ["missing-field.patch: header lacks required field Drop-When:"]


def test_bad_upstream_status_named() -> None:
    text = (DATA / "exact.patch").read_text().replace("Upstream-Status: not upstream", "Upstream-Status: maybe")
    assert "Upstream-Status 'maybe' is not one of" in parse_patch_text(text, "x.patch").header_problems()[0]


def test_crlf_mangled_file_is_a_clear_error() -> None:
    with pytest.raises(PatchParseError, match=r"CRLF \(Windows\) line endings throughout.*dos2unix"):
        read_patch(DATA / "crlf-mangled.patch")


def test_truncated_patch_does_not_parse() -> None:
    with pytest.raises(PatchParseError, match=r"broken.patch: .*(truncated|does not parse)"):
        read_patch(DATA / "broken.patch")


def test_prose_is_not_a_patch() -> None:
    with pytest.raises(PatchParseError, match="no 'diff --git' section found"):
        read_patch(DATA / "not-a-patch.patch")
