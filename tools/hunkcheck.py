"""Classify every hunk of a series against file text: exact / offset N / fuzz / failed.

Like ungoogled-chromium's validator, a cursor walks each file hunk by hunk (a later hunk may not
match above an earlier one), but every result names the patch, the file, the hunk header, the line,
and the expected and actual text, and checking goes on after a failure so one run reports all of
them. Files are simulated in memory (``TreeState``), so nothing touches git until every hunk of
every patch has been classified.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from enum import Enum
from typing import Callable, Iterable, TypeGuard

from tools.patchfile import FilePatch, Hunk, Patch
from tools.progress import count_summary

MAX_FUZZ = 2  # what GNU patch would silently accept; we only use it to say "would apply with fuzz"


class HunkStatus(Enum):
    EXACT = "exact"
    OFFSET = "offset"
    FUZZ = "fuzz"
    FAILED = "failed"
    # Every hunk matched, but the file does not come out as the patch's index line says: hunks
    # were lost (a truncated file) or edited by hand.
    DAMAGED = "damaged"

    @property
    def rank(self) -> int:
        return list(HunkStatus).index(self)


@dataclass(frozen=True)
class HunkResult:
    patch: str
    path: str
    header: str
    status: HunkStatus
    line: int  # 1-based line in the file where the hunk was expected (or found)
    offset: int = 0
    fuzz: int = 0
    expected: str | None = None
    actual: str | None = None
    note: str = ""

    @property
    def label(self) -> str:
        if self.status is HunkStatus.OFFSET:
            return f"offset {self.offset:+d}"
        if self.status is HunkStatus.FUZZ:
            return f"fuzz {self.fuzz}" + (f" offset {self.offset:+d}" if self.offset else "")
        return self.status.value

    def describe(self) -> str:
        where = f"{self.patch}: {self.path}: hunk {self.header}"
        if self.status is HunkStatus.DAMAGED:
            return (
                f"{self.patch}: {self.path}: damaged: after the patch the file has blob {self.actual}, but the "
                f"patch's index line says {self.expected}. {self.note}"
            )
        if self.status is HunkStatus.EXACT:
            return f"{where}: exact"
        if self.status is HunkStatus.OFFSET:
            return (
                f"{where}: applies {abs(self.offset)} line(s) {'below' if self.offset > 0 else 'above'} "
                f"where it says (line {self.line - self.offset} -> {self.line}); refresh the patch"
            )
        if self.status is HunkStatus.FUZZ:
            return (
                f"{where}: would only apply with fuzz {self.fuzz} at line {self.line} (its outer "
                f"context no longer matches; expected {self.expected!r}, found {self.actual!r}); "
                "port the patch by hand: fuzz can put a hunk in the wrong place"
            )
        msg = f"{where}: does not apply at line {self.line}"
        if self.note:
            msg += f": {self.note}"
        if self.expected is not None or self.actual is not None:
            msg += f"\n    expected: {self.expected!r}\n    actual:   {self.actual!r}"
        return msg


@dataclass(frozen=True)
class PatchResult:
    patch: str
    hunks: tuple[HunkResult, ...]

    @property
    def status(self) -> HunkStatus:
        if not self.hunks:
            return HunkStatus.EXACT
        return max((h.status for h in self.hunks), key=lambda s: s.rank)

    def summary(self) -> str:
        return count_summary((h.status.value for h in self.hunks), "no hunks")

    def problems(self, allow_offset: bool = False) -> list[HunkResult]:
        ok = {HunkStatus.EXACT} | ({HunkStatus.OFFSET} if allow_offset else set())
        return [h for h in self.hunks if h.status not in ok]


def split_lines(text: str) -> list[str]:
    """Split on LF only, keeping endings (``str.splitlines`` would also split on \\x0c etc.)."""
    if not text:
        return []
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class TreeState:
    """File contents as patches would leave them; files are loaded lazily from ``reader``."""

    def __init__(self, reader: Callable[[str], str | None]) -> None:
        self._reader = reader
        self._files: dict[str, str | None] = {}
        self.changed_by: dict[str, list[str]] = {}  # path -> the patches that changed it, in order

    def original(self, path: str) -> str | None:
        """The file as the base has it, before any patch."""
        return self._reader(path)

    def get(self, path: str) -> str | None:
        if path not in self._files:
            self._files[path] = self._reader(path)
        return self._files[path]

    def set(self, path: str, text: str | None) -> None:
        self._files[path] = text


def _matches(lines: list[str], pos: int, old: list[str]) -> bool:
    return 0 <= pos and pos + len(old) <= len(lines) and lines[pos : pos + len(old)] == old


def _search(lines: list[str], old: list[str], expected: int, lo: int) -> int | None:
    """Nearest position >= lo where ``old`` matches, preferring ``expected``."""
    best = None
    for pos in range(lo, len(lines) - len(old) + 1):
        if lines[pos : pos + len(old)] == old:
            if best is None or abs(pos - expected) < abs(best - expected):
                best = pos
            elif pos > expected:
                break
    return best


def _expected_index(h: Hunk) -> int:
    # "-0,0" (and any zero-length source) means "insert after line N".
    return h.source_start if h.source_length == 0 else h.source_start - 1


def _first_mismatch(lines: list[str], pos: int, old: list[str]) -> tuple[int, str | None, str | None]:
    for i, want in enumerate(old):
        have = lines[pos + i] if 0 <= pos + i < len(lines) else None
        if have != want:
            return pos + i, want, have
    return pos, None, None


def _mismatch_note(want: str | None, have: str | None) -> str:
    if want is None or have is None:
        return "the file ends before the hunk's context does" if have is None else ""
    if want.rstrip("\r\n") == have.rstrip("\r\n"):
        if want.endswith("\r\n") != have.endswith("\r\n"):
            return "line endings differ (CRLF vs LF): re-export the patch from the tree, do not edit it on Windows"
        return "only the newline at end of file differs (\\ No newline at end of file)"
    return "context differs"


def classify_hunk(
    patch: str, path: str, lines: list[str], h: Hunk, cursor: int
) -> tuple[HunkResult, int | None, list[str]]:
    """Return the result, the index where the (possibly trimmed) old text matched, and that text."""
    old = h.old_lines
    exp = _expected_index(h)
    if exp >= cursor and _matches(lines, exp, old):
        return HunkResult(patch, path, h.header, HunkStatus.EXACT, exp + 1), exp, old
    pos = _search(lines, old, exp, cursor) if old else None
    if pos is not None:
        return (
            HunkResult(patch, path, h.header, HunkStatus.OFFSET, pos + 1, offset=pos - exp),
            pos,
            old,
        )
    kinds = [ln.kind for ln in h.lines if ln.kind in " -"]
    lead = next((i for i, k in enumerate(kinds) if k != " "), len(kinds))
    trail = next((i for i, k in enumerate(reversed(kinds)) if k != " "), len(kinds))
    for fuzz in range(1, MAX_FUZZ + 1):
        top, bottom = min(fuzz, lead), min(fuzz, trail)
        if top == 0 and bottom == 0:
            continue
        trimmed = old[top : len(old) - bottom]
        if not trimmed:
            continue
        pos = _search(lines, trimmed, exp + top, cursor)
        if pos is not None:
            at, want, have = _first_mismatch(lines, pos - top, old)
            return (
                HunkResult(
                    patch,
                    path,
                    h.header,
                    HunkStatus.FUZZ,
                    pos - top + 1,
                    offset=pos - top - exp,
                    fuzz=fuzz,
                    expected=want,
                    actual=have,
                ),
                None,
                old,
            )
    at, want, have = _first_mismatch(lines, max(exp, cursor), old)
    return (
        HunkResult(
            patch,
            path,
            h.header,
            HunkStatus.FAILED,
            at + 1,
            expected=want,
            actual=have,
            note=_mismatch_note(want, have),
        ),
        None,
        old,
    )


DAMAGED_NOTE = (
    "The patch file is damaged or was edited by hand (hunks lost or changed): restore it from git "
    "(`git checkout patches/{patch}`), or re-create it with `make refresh` from a tree that holds the whole change."
)


def _names_blob(blob: str | None) -> TypeGuard[str]:
    """The index line names a blob: not absent, not git's all-zero id of a missing file."""
    return bool(blob) and set(blob or "") != {"0"}


def _text_blob(text: str) -> str:
    return blob_id(text.encode("utf-8", "surrogateescape"))


def damaged_file(patch: str, fp: FilePatch, old_text: str | None, new_text: str) -> HunkResult | None:
    """The patch's own record of the result (its ``index <pre>..<post>`` line), checked where it can be:
    on the file the patch was made against. Elsewhere (a rebase onto a changed file) it cannot hold."""
    if fp.source is not None and not (_names_blob(fp.old_blob) and _text_blob(old_text or "").startswith(fp.old_blob)):
        return None
    if not _names_blob(fp.new_blob):
        return None
    got = _text_blob(new_text)
    if got.startswith(fp.new_blob):
        return None
    return HunkResult(
        patch,
        fp.path,
        "(whole file)",
        HunkStatus.DAMAGED,
        0,
        expected=fp.new_blob,
        actual=got,
        note=DAMAGED_NOTE.format(patch=patch),
    )


def _file_level_failure(patch: str, fp: FilePatch, note: str) -> HunkResult:
    header = fp.hunks[0].header if fp.hunks else "(whole file)"
    return HunkResult(patch, fp.path, header, HunkStatus.FAILED, 0, note=note)


def _blame_earlier(res: HunkResult, h: Hunk, state: TreeState, path: str) -> HunkResult:
    """Name the earlier patches of the series that changed the file a hunk does not apply to."""
    earlier = state.changed_by[path]
    note = f"{', '.join(earlier)} {'changes' if len(earlier) == 1 else 'change'} {path} earlier in the series"
    base = state.original(path)
    if base is not None and classify_hunk(res.patch, res.path, split_lines(base), h, 0)[0].status is HunkStatus.EXACT:
        note += "; the hunk applies exactly to the base's file, so it conflicts with that change"
    return replace(res, note=f"{res.note}; {note}" if res.note else note)


def check_file(patch: str, fp: FilePatch, state: TreeState) -> list[HunkResult]:
    if fp.is_binary:
        return [_file_level_failure(patch, fp, "binary patches are not supported; keep binaries out of the series")]
    if fp.source is None:  # created
        if state.get(fp.target or "") is not None:
            return [_file_level_failure(patch, fp, f"the patch creates {fp.target}, which already exists")]
        created = "".join(ln for h in fp.hunks for ln in h.new_lines)
        state.set(fp.target or "", created)
        state.changed_by.setdefault(fp.target or "", []).append(patch)
        damage = damaged_file(patch, fp, None, created)
        return [HunkResult(patch, fp.path, h.header, HunkStatus.EXACT, 1) for h in fp.hunks] + (
            [damage] if damage else []
        ) or [HunkResult(patch, fp.path, "(new empty file)", HunkStatus.EXACT, 1)]
    text = state.get(fp.source)
    if text is None:
        return [_file_level_failure(patch, fp, f"{fp.source} does not exist in the tree")]
    if fp.is_rename and fp.target is not None and state.get(fp.target) is not None:
        return [_file_level_failure(patch, fp, f"rename target {fp.target} already exists")]
    lines = split_lines(text)
    results: list[HunkResult] = []
    edits: list[tuple[int, int, list[str]]] = []
    cursor = 0
    for h in fp.hunks:
        res, pos, old = classify_hunk(patch, fp.path, lines, h, cursor)
        if res.status is not HunkStatus.EXACT and state.changed_by.get(fp.source):
            res = _blame_earlier(res, h, state, fp.source)
        results.append(res)
        if pos is not None:
            edits.append((pos, len(old), h.new_lines))
            cursor = pos + len(old)
    for pos, n, new in sorted(edits, reverse=True):
        lines[pos : pos + n] = new
    new_text = "".join(lines)
    if fp.target is None:  # deleted: the hunk must have consumed the whole file
        if new_text:
            results.append(
                _file_level_failure(patch, fp, "the patch deletes the file but its content differs from the tree's")
            )
        state.set(fp.source, None)
    else:
        if fp.is_rename:
            state.set(fp.source, None)
        state.set(fp.target, new_text)
        state.changed_by.setdefault(fp.target, []).append(patch)
        damage = damaged_file(patch, fp, text, new_text)
        if damage and all(r.status is HunkStatus.EXACT for r in results):
            results.append(damage)
    if not fp.hunks:
        results.append(HunkResult(patch, fp.path, "(rename or mode change)", HunkStatus.EXACT, 1))
    return results


def check_patch(patch: Patch, state: TreeState) -> PatchResult:
    results: list[HunkResult] = []
    for fp in patch.files:
        results.extend(check_file(patch.name, fp, state))
    return PatchResult(patch.name, tuple(results))


def check_series(patches: Iterable[Patch], state: TreeState) -> list[PatchResult]:
    """Classify every patch in order; later patches see the earlier ones applied (failed hunks skipped)."""
    return [check_patch(p, state) for p in patches]
