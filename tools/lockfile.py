"""sglang.lock: which upstream source a ref was materialised from (URL and checksum or commit).

The pinned ref's entry lives in ``sglang.lock`` (committed); any other ref's first sighting is kept
under the cache (trust on first use), so a later fetch that disagrees with either is caught.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from tools.errors import UpstreamError
from tools.project import Project


@dataclass(frozen=True)
class LockEntry:
    ref: str
    source: str  # "git" | "pypi-sdist" | "pypi-wheel"
    url: str
    sha256: str | None = None  # archive checksum (PyPI sources)
    commit: str | None = None  # upstream commit (git source)
    base_commit: str | None = None  # the base commit the tool built (deterministic)

    def describe(self) -> str:
        pin = f"sha256 {self.sha256}" if self.sha256 else f"commit {self.commit}"
        return f"{self.ref} from {self.source} {self.url} ({pin})"


def read_lock(path: Path) -> LockEntry | None:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return LockEntry(**data)
    except (ValueError, TypeError) as e:
        raise UpstreamError(f"{path.name} is not a valid lock file ({e}); restore it from git") from None


def write_lock(path: Path, entry: LockEntry) -> None:
    path.write_text(json.dumps(asdict(entry), indent=2) + "\n", encoding="utf-8")


def pinned_ref(project: Project) -> str | None:
    lock = read_lock(project.lock_path)
    return lock.ref if lock else None


def _seen_path(project: Project, ref: str) -> Path:
    return project.cache_dir / "seen" / f"{ref}.json"


def lock_path_for(project: Project, ref: str) -> Path:
    """sglang.lock for the pinned ref; for other refs the record of what this checkout saw first (TOFU)."""
    lock = read_lock(project.lock_path)
    return project.lock_path if lock and lock.ref == ref else _seen_path(project, ref)


def known_entry(project: Project, ref: str) -> LockEntry | None:
    return read_lock(lock_path_for(project, ref))


def record_entry(project: Project, entry: LockEntry) -> None:
    lock = read_lock(project.lock_path)
    if lock is None or lock.ref == entry.ref:
        write_lock(project.lock_path, entry)
    else:
        _seen_path(project, entry.ref).parent.mkdir(parents=True, exist_ok=True)
        write_lock(_seen_path(project, entry.ref), entry)
