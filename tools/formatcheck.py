"""SGLang's own formatters on what the series changes: black and isort, at the versions upstream's
pre-commit pins, with upstream's isort settings (profile black, sglang first-party).

A file is reported only when the formatter accepts upstream's version of it and not the patched
one, so upstream's own formatting is never blamed on a patch.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass
from enum import Enum
from importlib import metadata

from tools.gitutil import Git

BLACK_VERSION = "24.10.0"
ISORT_VERSION = "5.13.2"


class Formatter(Enum):
    BLACK = "black"
    ISORT = "isort"

    def argv(self, path: str) -> list[str]:
        if self is Formatter.BLACK:
            return [sys.executable, "-m", "black", "--check", "--diff", "--quiet", "--stdin-filename", path, "-"]
        return [
            sys.executable,
            "-m",
            "isort",
            "--check-only",
            "--diff",
            "--quiet",
            "--profile",
            "black",
            "--project",
            "sglang",
            "-",
        ]


@dataclass(frozen=True)
class FormatProblem:
    formatter: Formatter
    path: str
    diff: str

    def describe(self) -> str:
        head = "\n".join(self.diff.splitlines()[:12])
        return (
            f"{self.path}: {self.formatter.value} would reformat the patched file (upstream's own version "
            f"passes); format it in the tree and `make refresh`:\n{head}"
        )


def missing_formatters() -> list[str]:
    """Formatters that are absent or at another version than upstream pins (they run in this Python)."""
    out = []
    for module, want in (("black", BLACK_VERSION), ("isort", ISORT_VERSION)):
        try:
            have = metadata.version(module)
        except metadata.PackageNotFoundError:
            have = "not installed"
        if have != want:
            out.append(f"{module} {want} (found {have}; it is in ci/requirements.txt)")
    return out


def _rejects(formatter: Formatter, path: str, text: bytes) -> str | None:
    """The formatter's diff when it would change ``text``; None when it accepts it.

    Run from an empty folder, so no configuration of ours (or the user's) is discovered."""
    with tempfile.TemporaryDirectory(prefix="fmt-") as empty:
        proc = subprocess.run(formatter.argv(path), input=text, capture_output=True, cwd=empty)
    if proc.returncode == 0:
        return None
    return proc.stdout.decode("utf-8", "replace") or proc.stderr.decode("utf-8", "replace")


def format_problems(repo: Git, base: str, head: str) -> list[FormatProblem]:
    """Every Python file changed between base and head that upstream's formatters reject."""
    changed = repo.out("diff", "--name-only", "--diff-filter=AMR", base, head).splitlines()
    problems = []
    for path in [p for p in changed if p.endswith(".py")]:
        patched = repo.show_file(head, path) or b""
        upstream = repo.show_file(base, path)
        for formatter in Formatter:
            diff = _rejects(formatter, path, patched)
            if diff is not None and (upstream is None or _rejects(formatter, path, upstream) is None):
                problems.append(FormatProblem(formatter, path, diff))
    return problems
