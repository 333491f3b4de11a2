"""The ``series`` file: one patch file name per line (relative to ``patches/``), in apply order.

``#`` starts a comment (whole line or trailing); blank lines are ignored. Order lives here, not in
file-name prefixes (Electron's ``.patches``).

>>> [e.name for e in parse_series_text("# c\\na.patch\\n\\nb.patch  # why\\n")]
['a.patch', 'b.patch']
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from tools.errors import SeriesError


@dataclass(frozen=True)
class SeriesEntry:
    name: str
    lineno: int


@dataclass(frozen=True)
class Series:
    entries: tuple[SeriesEntry, ...]

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def __len__(self) -> int:
        return len(self.entries)


def parse_series_text(text: str, source: str = "series") -> list[SeriesEntry]:
    entries = []
    for i, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 1:
            # quilt allows "-p1" style options after the name; we never need them and a stray
            # option silently changing how a patch applies is worse than an error.
            raise SeriesError(f"{source}:{i}: expected one patch file name per line, got {raw!r}")
        name = parts[0]
        if name.startswith("/") or ".." in Path(name).parts:
            raise SeriesError(f"{source}:{i}: {name!r} must be a path inside patches/")
        entries.append(SeriesEntry(name, i))
    return entries


def read_series(path: Path) -> Series:
    if not path.exists():
        return Series(())
    return Series(tuple(parse_series_text(path.read_text(encoding="utf-8"), path.name)))


class SeriesProblemKind(Enum):
    DUPLICATE = "duplicate"
    MISSING = "missing"  # listed, no file
    UNUSED = "unused"  # a file in patches/ that series does not list


@dataclass(frozen=True)
class SeriesProblem:
    kind: SeriesProblemKind
    message: str

    def __str__(self) -> str:
        return self.message


def series_problems(series: Series, patches_dir: Path) -> list[SeriesProblem]:
    """Every way ``series`` and ``patches/`` disagree (missing, unused, duplicate)."""
    problems = []
    seen: dict[str, int] = {}
    for e in series.entries:
        if e.name in seen:
            problems.append(
                SeriesProblem(
                    SeriesProblemKind.DUPLICATE,
                    f"series:{e.lineno}: {e.name} is listed twice (first on line {seen[e.name]}); remove one",
                )
            )
        else:
            seen[e.name] = e.lineno
        if not (patches_dir / e.name).is_file():
            problems.append(
                SeriesProblem(
                    SeriesProblemKind.MISSING,
                    f"series:{e.lineno}: {e.name} has no file patches/{e.name}; add the file or remove the line",
                )
            )
    if patches_dir.is_dir():
        for p in sorted(patches_dir.rglob("*.patch")):
            rel = p.relative_to(patches_dir).as_posix()
            if rel not in seen:
                problems.append(
                    SeriesProblem(
                        SeriesProblemKind.UNUSED,
                        f"patches/{rel} is not listed in series; add it to series or delete it",
                    )
                )
    return problems


def append_to_series(path: Path, names: list[str]) -> None:
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if text and not text.endswith("\n"):
        text += "\n"
    text += "".join(f"{n}\n" for n in names)
    path.write_text(text, encoding="utf-8")
