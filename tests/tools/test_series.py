from pathlib import Path

import pytest

from tools.errors import SeriesError
from tools.series import SeriesProblemKind, append_to_series, parse_series_text, read_series, series_problems


def test_parse_comments_blank_and_trailing() -> None:
    entries = parse_series_text("# head\n\na.patch\nb.patch   # note\n  c.patch\n")
    assert [(e.name, e.lineno) for e in entries] == [("a.patch", 3), ("b.patch", 4), ("c.patch", 5)]


def test_options_after_name_are_refused() -> None:
    with pytest.raises(SeriesError, match=r"series:1: expected one patch file name per line"):
        parse_series_text("a.patch -p0\n")


def test_path_outside_patches_refused() -> None:
    with pytest.raises(SeriesError, match="must be a path inside patches/"):
        parse_series_text("../evil.patch\n")


def test_missing_unused_duplicate_all_reported(tmp_path: Path) -> None:
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "a.patch").write_text("x")
    (tmp_path / "patches" / "unused.patch").write_text("x")
    (tmp_path / "series").write_text("a.patch\nmissing.patch\na.patch\n")
    probs = series_problems(read_series(tmp_path / "series"), tmp_path / "patches")
    by_kind = {p.kind: p.message for p in probs}
    assert "series:2: missing.patch has no file patches/missing.patch" in by_kind[SeriesProblemKind.MISSING]
    assert "series:3: a.patch is listed twice (first on line 1)" in by_kind[SeriesProblemKind.DUPLICATE]
    assert "patches/unused.patch is not listed in series" in by_kind[SeriesProblemKind.UNUSED]
    assert len(probs) == 3


def test_append_keeps_existing_lines(tmp_path: Path) -> None:
    s = tmp_path / "series"
    s.write_text("# c\na.patch")
    append_to_series(s, ["b.patch"])
    assert s.read_text() == "# c\na.patch\nb.patch\n"
