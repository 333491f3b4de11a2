"""The ``series`` file: one patch file name per line (relative to ``patches/``), in apply order.

``#`` starts a comment (whole line or trailing); blank lines are ignored. Order lives here, not in
file-name prefixes (Electron's ``.patches``).

>>> [e.name for e in parse_series_text("# c\\na.patch\\n\\nb.patch  # why\\n")]
['a.patch', 'b.patch']
"""
from __future__ import annotations

from dataclasses import dataclass
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


def series_problems(series: Series, patches_dir: Path) -> list[str]:
    """Every way ``series`` and ``patches/`` disagree (missing, unused, duplicate)."""
    problems = []
    seen: dict[str, int] = {}
    for e in series.entries:
        if e.name in seen:
            problems.append(
                f"series:{e.lineno}: {e.name} is listed twice (first on line {seen[e.name]}); remove one"
            )
        else:
            seen[e.name] = e.lineno
        if not (patches_dir / e.name).is_file():
            problems.append(
                f"series:{e.lineno}: {e.name} has no file patches/{e.name}; "
                "add the file or remove the line"
            )
    if patches_dir.is_dir():
        for p in sorted(patches_dir.rglob("*.patch")):
            rel = p.relative_to(patches_dir).as_posix()
            if rel not in seen:
                problems.append(
                    f"patches/{rel} is not listed in series; add it to series or delete it"
                )
    return problems


def check_series(series: Series, patches_dir: Path) -> None:
    problems = series_problems(series, patches_dir)
    if problems:
        raise SeriesError("\n".join(problems))


def append_to_series(path: Path, names: list[str]) -> None:
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if text and not text.endswith("\n"):
        text += "\n"
    text += "".join(f"{n}\n" for n in names)
    path.write_text(text, encoding="utf-8")


def write_series_names(path: Path, names: list[str]) -> None:
    """Rewrite the entries keeping comment-only lines at the top (used by rebase when dropping)."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    head = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            break
        head.append(line)
    path.write_text("".join(f"{h}\n" for h in head) + "".join(f"{n}\n" for n in names), encoding="utf-8")
