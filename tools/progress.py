"""Progress lines for long steps. They go to stderr so that stdout stays parseable (status tables, reports)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

logger = logging.getLogger(__name__)


def count_summary(values: Iterable[str], empty: str) -> str:
    """'3 exact, 1 offset': how many of each, in order of first appearance."""
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in counts.items()) or empty


class Counter:
    """``[3/12] applying foo.patch`` style progress."""

    def __init__(self, total: int, verb: str) -> None:
        self.total = total
        self.verb = verb
        self.n = 0

    def step(self, what: str) -> None:
        self.n += 1
        logger.info(f"[{self.n}/{self.total}] {self.verb} {what}")
