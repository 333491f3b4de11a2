"""A code corpus from the machine itself: Python sources in a sorted order, cut at a byte budget.

The trained fixtures learn from it, so it must be the same every time on a given machine: the files
are taken in sorted order of their path relative to the root, and the text stops at the budget.
The default root is the running Python's standard library (the same files on every machine with
the same Python release); test suites are left out, as they are mostly data and fixtures.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from bench.errors import BenchError

SKIPPED_DIRS = frozenset({"test", "tests", "site-packages", "dist-packages", "__pycache__", "idlelib", "lib2to3"})


class CorpusError(BenchError):
    pass


@dataclass(frozen=True)
class Corpus:
    root: Path
    files: tuple[str, ...]  # relative paths, in the order their text was taken
    text: str
    digest: str  # sha256 of the text

    @property
    def size(self) -> int:
        return len(self.text.encode("utf-8"))


def default_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: Path) -> list[Path]:
    """Every .py file under root outside the skipped folders, sorted by relative path."""
    found = [
        p for p in root.rglob("*.py") if p.is_file() and not SKIPPED_DIRS.intersection(p.relative_to(root).parts[:-1])
    ]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def code_corpus(byte_budget: int, root: Path | None = None) -> Corpus:
    """The first byte_budget bytes (whole files, the last one cut) of the sources under root."""
    root = root or default_root()
    if byte_budget < 1:
        raise CorpusError(f"the corpus byte budget must be at least 1, got {byte_budget}")
    parts: list[str] = []
    taken: list[str] = []
    left = byte_budget
    for path in source_files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a file that is not UTF-8 text says nothing the others do not
        data = text.encode("utf-8")[:left]
        parts.append(data.decode("utf-8", errors="ignore"))
        taken.append(path.relative_to(root).as_posix())
        left -= len(data)
        if left <= 0:
            break
    if not parts:
        raise CorpusError(f"no Python sources under {root}: pass a folder that holds some")
    text = "".join(parts)
    return Corpus(root, tuple(taken), text, hashlib.sha256(text.encode("utf-8")).hexdigest())


def code_prompts(text: str, count: int, lines: int = 6, max_chars: int = 400) -> list[str]:
    """count distinct snippets of text, each up to `lines` whole lines (at most max_chars) starting at
    a non-blank line, spread evenly over it: prompts in the language a target trained on such text
    learned, where it should meet fewer near-tied choices than on English prose."""
    rows = text.splitlines(keepends=True)
    if count < 1 or lines < 1:
        raise CorpusError(f"code prompts: count and lines must be at least 1, got {count} and {lines}")
    stride = max(1, len(rows) // count)
    out: list[str] = []
    seen: set[str] = set()
    for start in range(0, len(rows), stride):
        first = next((i for i in range(start, min(start + stride, len(rows))) if rows[i].strip()), None)
        if first is None:
            continue
        snippet = ""
        for row in rows[first : first + lines]:
            if snippet and len(snippet) + len(row) > max_chars:
                break
            snippet += row
        snippet = snippet[:max_chars]
        if snippet not in seen:
            seen.add(snippet)
            out.append(snippet)
        if len(out) == count:
            return out
    raise CorpusError(
        f"code prompts: the text gives {len(out)} distinct snippets, fewer than the {count} asked: "
        "raise corpus_bytes or lower the count"
    )
