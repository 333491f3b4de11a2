"""Where things live in the project, and the knobs that come from the environment."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_REMOTE = "https://github.com/sgl-project/sglang.git"
DEFAULT_INDEX_URL = "https://pypi.org/simple"

# Identity and date stamped on every commit and exported patch the tool makes, so that
# re-export never churns and applying the same series twice gives the same commit ids.
IDENT_NAME = "sglang-patches"
IDENT_EMAIL = "sglang-patches@invalid"
IDENT_DATE = "Thu, 1 Jan 2026 00:00:00 +0000"
IDENT_DATE_GIT = "2026-01-01T00:00:00+0000"


LINES_DIR = "lines"


@dataclass(frozen=True)
class Project:
    """A checkout and one of its release lines: the default line (series, patches/, sglang.lock and
    tests/patches at the root) or ``lines/<ref>/`` with the same layout. Caches and build trees are
    the checkout's, shared by every line."""

    root: Path
    line: str | None = None  # None: the default line

    @property
    def line_dir(self) -> Path:
        return self.root if self.line is None else self.root / LINES_DIR / self.line

    @property
    def series_path(self) -> Path:
        return self.line_dir / "series"

    @property
    def patches_dir(self) -> Path:
        return self.line_dir / "patches"

    @property
    def lock_path(self) -> Path:
        return self.line_dir / "sglang.lock"

    @property
    def label(self) -> str:
        """How messages name the line: its folder relative to the checkout."""
        return "." if self.line is None else f"{LINES_DIR}/{self.line}"

    @property
    def line_requirements(self) -> Path | None:
        """The line's own CPU test environment, when it needs one (another SGLang release's imports)."""
        req = self.line_dir / "requirements.txt"
        return req if self.line is not None and req.is_file() else None

    @property
    def line_venv(self) -> Path:
        """Where `make test SGLANG_REF=<line>` sets that environment up."""
        return self.root / f".venv-{self.line}"

    @property
    def line_python(self) -> Path:
        return self.line_venv / "bin" / "python"

    @property
    def gpu_wheels(self) -> Path:
        """The wheel list of the line's offline GPU bundle (a line without one is CPU-tested only)."""
        if self.line is None:
            return self.root / "ci" / "gpu" / "wheels.txt"
        return self.line_dir / "gpu-wheels.txt"

    def with_line(self, line: str | None) -> Project:
        return Project(self.root, line)

    def extra_lines(self) -> list[str]:
        """The refs of the lines kept under lines/, in release order."""
        from tools.versions import release_order

        base = self.root / LINES_DIR
        found = [d.name for d in base.iterdir() if (d / "series").is_file()] if base.is_dir() else []
        return sorted(found, key=release_order)

    def all_lines(self) -> list[Project]:
        """Every line of the checkout, the default one first."""
        return [self.with_line(None), *(self.with_line(r) for r in self.extra_lines())]

    def line_for(self, ref: str | None) -> Project:
        """The line that serves ref: lines/<ref> when it exists, else the default line."""
        if ref and (self.root / LINES_DIR / ref / "series").is_file():
            return self.with_line(ref)
        return self.with_line(None)

    @property
    def cache_dir(self) -> Path:
        return self.root / ".cache" / "sglang"

    @property
    def build_dir(self) -> Path:
        return self.root / "build"

    def tree_for(self, ref: str) -> Path:
        return self.build_dir / f"sglang-{ref}"


def default_root() -> Path:
    return Path(__file__).resolve().parent.parent


def env_remote() -> str:
    return os.environ.get("SGLANG_REMOTE") or DEFAULT_REMOTE


def env_index_url() -> str:
    """SGLANG_INDEX_URL, else the index pip itself is configured with (PIP_INDEX_URL, pip.conf), else PyPI."""
    return (os.environ.get("SGLANG_INDEX_URL") or pip_index_url() or DEFAULT_INDEX_URL).rstrip("/")


def pip_index_url() -> str | None:
    """The index-url of the user's pip configuration, as `pip config list` reports it."""
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"]
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".index-url"):
            found[key.split(".", 1)[0]] = value.strip().strip("'\"")
    # pip's own precedence between sections: the command's section over global.
    return found.get("download") or found.get("install") or found.get("global")


def env_repo() -> str | None:
    return os.environ.get("SGLANG_REPO") or None
