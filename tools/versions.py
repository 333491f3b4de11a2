"""SGLang release refs (``v0.5.9``, ``v0.5.10.post1``): the one place that parses them."""

from __future__ import annotations

import re

from packaging.version import InvalidVersion, Version

from tools.errors import UsageError

_RELEASE_RE = re.compile(r"^v?(\d+\.\d+\.\d+(?:\.post\d+)?)$")


def release_version(ref: str) -> str | None:
    """The PyPI version a release tag names (``v0.5.9`` -> ``0.5.9``); None for other refs."""
    m = _RELEASE_RE.match(ref.strip())
    return m.group(1) if m else None


def release_key(ref: str) -> Version | None:
    """An orderable version for a release tag; None for refs that are not releases (branches, hashes)."""
    version = release_version(ref)
    try:
        return Version(version) if version else None
    except InvalidVersion:
        return None


def release_order(ref: str) -> tuple[bool, Version, str]:
    """A sort key: releases in version order, then other refs by name."""
    key = release_key(ref)
    return (key is None, key or Version("0"), ref)


_REF_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/+-]*")


def check_ref_name(ref: str, what: str) -> str:
    """A ref as the user typed it, refused before any git command or shell sees it unless it is one."""
    bad = not _REF_NAME.fullmatch(ref) or ".." in ref or "//" in ref or ref.endswith(("/", ".", ".lock")) or "/." in ref
    if bad:
        raise UsageError(f"{what} {ref!r} is not a git ref (letters, digits and . _ - / + only, e.g. v0.5.9)")
    return ref
