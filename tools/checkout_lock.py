"""One run at a time over a checkout's build/ and .cache/: an advisory lock (flock) held for the
whole command, and the scratch a killed run left behind swept once the lock is ours."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from tools.errors import ToolError
from tools.project import Project

logger = logging.getLogger(__name__)

LOCK_NAME = ".tools.lock"
# Scratch that exists only while a command runs: left over, it is a killed run's.
STALE = (
    ("build", ".apply-*"),
    ("build", ".rebase-*"),
    ("cache", "sglang-src-*"),
    ("cache", ".check-*"),
    ("cache", "archives/*.part"),
)


class BusyError(ToolError):
    """Another command of the toolkit holds the checkout."""


def _owner(path: Path) -> str:
    try:
        return path.read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def sweep_stale(project: Project) -> int:
    """Remove what interrupted runs left; call only with the lock held."""
    roots = {"build": project.build_dir, "cache": project.cache_dir}
    stale = [p for where, pattern in STALE for p in roots[where].glob(pattern)]
    for p in stale:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    if stale:
        logger.info(
            f"removed {len(stale)} temporary file(s) or folder(s) an interrupted run left: "
            + ", ".join(str(p.relative_to(project.root)) for p in stale[:4])
            + (" ..." if len(stale) > 4 else "")
        )
    return len(stale)


@contextlib.contextmanager
def hold(project: Project, command: str) -> Iterator[None]:
    """Hold the checkout's lock for one command; refuse at once, naming the holder, if it is taken."""
    project.build_dir.mkdir(parents=True, exist_ok=True)
    path = project.build_dir / LOCK_NAME
    with path.open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BusyError(
                f"another toolkit run ({_owner(path)}) is using {project.build_dir} and {project.cache_dir}; "
                "wait for it to finish, or stop it, and run again (nothing was changed)"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}, {command}\n")
        f.flush()
        sweep_stale(project)
        try:
            yield
        finally:
            f.seek(0)
            f.truncate()
