"""Apply a patch to a plain directory (no git): every hunk is checked first, as ``make check``
checks the series, and the directory is written only if all of them apply (exactly, or where
later changes moved them when offsets are allowed)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from tools.errors import ApplyError
from tools.hunkcheck import TreeState, check_patch
from tools.patchfile import Patch


def _reader(root: Path) -> Callable[[str], str | None]:
    def read(path: str) -> str | None:
        f = root / path
        return f.read_bytes().decode("utf-8", "surrogateescape") if f.is_file() else None

    return read


def apply_to_directory(patch: Patch, root: Path, allow_offset: bool = False) -> list[str]:
    """Apply ``patch`` to the files under ``root``; the paths it changed. Nothing is written when a
    hunk does not apply exactly (or, with allow_offset, at its exact text elsewhere, as when later
    changes moved it): the error names each such hunk, then sums them up in one line."""
    state = TreeState(_reader(root))
    result = check_patch(patch, state)
    problems = result.problems(allow_offset)
    if problems:
        where = "where it says or moved" if allow_offset else "exactly"
        raise ApplyError(
            "\n".join(p.describe() for p in problems)
            + f"\n{patch.name}: {len(problems)} of {len(result.hunks)} hunk(s) do not apply {where} to {root}; "
            "nothing was written"
        )
    changed = [fp.path for fp in patch.files] + [fp.source for fp in patch.files if fp.is_rename and fp.source]
    for path in dict.fromkeys(changed):
        text = state.get(path)
        target = root / path
        if text is None:
            target.unlink(missing_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(text.encode("utf-8", "surrogateescape"))
    return list(dict.fromkeys(changed))
