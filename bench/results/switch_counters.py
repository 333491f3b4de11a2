"""The speculation switch's step counters over a stretch of a run (a closed-loop level, an open-loop
rate's measured requests), taken from the server's /metrics before and after it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.results.fields import Fields
from bench.results.logparse import Counters


@dataclass(frozen=True)
class SwitchCounters:
    """The speculation switch's step counters (a level's: the difference over the level)."""

    spec_steps: int
    fallback_steps: int
    switches: int

    @classmethod
    def of(cls, c: Counters) -> SwitchCounters:
        return cls(c.spec_steps, c.fallback_steps, c.switches)

    @classmethod
    def between(cls, before: Counters | None, after: Counters | None) -> SwitchCounters | None:
        """What the counters grew by; None where the server exports none (no switch)."""
        if after is None:
            return None
        return cls.of(after).minus(cls.of(before) if before else SwitchCounters(0, 0, 0))

    def minus(self, other: SwitchCounters) -> SwitchCounters:
        return SwitchCounters(
            self.spec_steps - other.spec_steps,
            self.fallback_steps - other.fallback_steps,
            self.switches - other.switches,
        )

    @property
    def spec_share(self) -> float | None:
        """The share of decode steps that speculated; None without a decode step."""
        steps = self.spec_steps + self.fallback_steps
        return self.spec_steps / steps if steps else None

    def to_json(self) -> dict[str, int]:
        return {"spec_steps": self.spec_steps, "fallback_steps": self.fallback_steps, "switches": self.switches}

    @classmethod
    def from_json(cls, data: Any, where: str) -> SwitchCounters:
        r = Fields(data, where)
        out = cls(r.integer("spec_steps"), r.integer("fallback_steps"), r.integer("switches"))
        r.closed()
        return out
