"""Where things live in the project, and the knobs that come from the environment."""
from __future__ import annotations

import os
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


@dataclass(frozen=True)
class Project:
    root: Path

    @property
    def series_path(self) -> Path:
        return self.root / "series"

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"

    @property
    def lock_path(self) -> Path:
        return self.root / "sglang.lock"

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
    return (os.environ.get("SGLANG_INDEX_URL") or DEFAULT_INDEX_URL).rstrip("/")


def env_repo() -> str | None:
    return os.environ.get("SGLANG_REPO") or None
