"""The user's documents stay short: the README under 12,000 bytes (figures go to docs/), docs/
under 2 MB (raw run files only where a page cites them)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_is_short() -> None:
    size = (ROOT / "README.md").stat().st_size
    assert size <= 12_000, f"README.md is {size} bytes: move figures and narration to docs/"


def test_docs_stay_under_two_megabytes() -> None:
    size = sum(f.stat().st_size for f in (ROOT / "docs").rglob("*") if f.is_file())
    assert size <= 2_000_000, f"docs/ holds {size} bytes: keep raw run files only where a page cites them"
