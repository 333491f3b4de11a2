"""Release lines: a new line ``lines/<ref>/`` starts as a copy of another, which a rebase then ports.

A line is a series, its patches, its lock and its per-patch CPU tests (``tests/patches``). The copy
points its patches' ``Tests:`` at its own copy of those tests, so porting the line's tests to the
new release never touches the line it came from.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

from tools.errors import UsageError
from tools.lockfile import pinned_ref
from tools.project import LINES_DIR, Project
from tools.series import read_series

logger = logging.getLogger(__name__)
# What every line's CPU tests share from the default line's tests/patches (each line's conftest.py
# finds it there): a copy in a line would shadow it, its own folder being first on sys.path.
SHARED_TEST_FILES = ("cpu_harness.py", "kernel_refs.py", "sglang_cpu.py", "spec_v2_cpu.py", "verify_cpu.py", "stubs")


def _tests_prefix(project: Project) -> str:
    return "tests/" if project.line is None else f"{LINES_DIR}/{project.line}/tests/"


def retarget_tests(text: str, old_prefix: str, new_prefix: str) -> str:
    """A patch mail with its header's Tests entries under old_prefix moved to new_prefix."""
    head, sep, diff = text.partition("\n---\n")
    head = re.sub(rf"(?m)^ {re.escape(old_prefix)}", f" {new_prefix}", head)
    return head + sep + diff


def start_line(source: Project, ref: str) -> Project:
    """Copy the source line to lines/<ref>/ (still pinned where the source is) and return it."""
    target = source.with_line(ref)
    if target.line_dir.exists():
        raise UsageError(
            f"{target.label} exists already: port it with `make rebase SGLANG_REF={ref}`, "
            f"or remove the folder to start it again"
        )
    if pinned_ref(source) == ref:
        raise UsageError(f"line {source.label} is at {ref} already: name another release")
    names = read_series(source.series_path).names
    old, new = _tests_prefix(source), _tests_prefix(target)
    (target.patches_dir).mkdir(parents=True)
    shutil.copy2(source.series_path, target.series_path)
    shutil.copy2(source.lock_path, target.lock_path)
    for name in names:
        text = (source.patches_dir / name).read_text(encoding="utf-8", errors="surrogateescape")
        (target.patches_dir / name).write_text(
            retarget_tests(text, old, new), encoding="utf-8", errors="surrogateescape"
        )
    tests = source.line_dir / "tests" / "patches"
    if tests.is_dir():
        shutil.copytree(
            tests,
            target.line_dir / "tests" / "patches",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", *SHARED_TEST_FILES),
        )
    logger.info(
        f"new line {target.label}: {len(names)} patch(es) and their CPU tests copied from {source.label}; "
        f"porting it to {ref}"
    )
    return target


def is_unfinished(line: Project) -> bool:
    """A line under lines/ whose lock does not name it yet: its first rebase has not completed."""
    return line.line is not None and pinned_ref(line) != line.line


def discard(line: Project) -> Path:
    """Remove a line that never reached its release (nothing in it exists anywhere else but as a copy)."""
    assert line.line is not None
    shutil.rmtree(line.line_dir)
    return line.line_dir
