"""The record of where speculation stops paying and the switch thresholds to use (bench.results.analysis
computes it, bench.results.records stores it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Recommendation:
    kind: str  # "crossover" | "never" | "always" | "insufficient"
    crossover: float | None  # interpolated concurrency where spec/no-spec = 1
    disable_batch_size: int | None
    enable_batch_size: int | None
    flags: str  # exact server flags to add ("" when none; for "never" the fallback if speculation must stay)
    message: str
    ratios: dict[int, float] = field(default_factory=dict)  # spec / no-spec per level
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ratios"] = {str(k): v for k, v in self.ratios.items()}
        return d
