"""One exception hierarchy; ``cli.main`` maps it to exit codes in one place (pre-commit style)."""

from __future__ import annotations


class ToolError(Exception):
    """A failure the user can act on. The message says what happened and what to do."""

    exit_code = 1


class UsageError(ToolError):
    exit_code = 2


class SeriesError(ToolError):
    """``series`` and ``patches/`` disagree, or ``series`` is malformed."""


class PatchParseError(ToolError):
    """A patch file cannot be parsed or its header is incomplete."""


class ApplyError(ToolError):
    """One or more patches do not apply as required."""


class UpstreamError(ToolError):
    """The upstream source could not be materialised (unknown ref, no network, bad archive, lock mismatch)."""


class UnsafeTreeError(ToolError):
    """The tree holds work that an operation would destroy."""

    exit_code = 3


class TestFailure(ToolError):
    """A patch's declared tests failed or do not exist."""


class GitError(ToolError):
    """A git command failed unexpectedly."""
