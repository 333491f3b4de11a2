"""The benchmark's failures, mapped to exit codes by bench.cli.main."""

from __future__ import annotations


class BenchError(RuntimeError):
    """A run that cannot go on (exit 1)."""


class BenchUsageError(BenchError):
    """Arguments that name nothing usable (exit 2)."""
