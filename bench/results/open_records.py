"""The open loop's typed record (one request rate of one config) and its results.json form.

In results.json a config's open-loop rates sit beside its closed-loop levels:

    "rates": [{"request_rate": 8.0 | "inf", "seed", "requests", "completed", "errors": [...],
               "output_tokens", "duration_s", "output_tok_per_s", "request_per_s",
               "arrival_rate" | null, "concurrency",
               "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
               "itl_p50_ms", "itl_p99_ms", "e2e_p50_ms",    # each latency null without a sample
               "counters": {"spec_steps", "fallback_steps", "switches"},  # the switch's steps from the
                                                                          # first measured send to the end
               "switch_threshold"}]                                       # a learning switch's, at the end

absent in runs without an open loop (and in every run before it), which read as no rates; "counters"
and "switch_threshold" are absent where the server exports none (no switch) and in older runs. The
definitions are SGLang's bench_serving's (bench.run.open_loop says which and how they are taken).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from bench.results.fields import Fields, ResultsError
from bench.results.switch_counters import SwitchCounters

INF = "inf"  # JSON has no infinity: an unpaced rate (all requests at once) is written as this string


@dataclass(frozen=True)
class OpenRateRecord:
    """One request rate of one config, as measured (latencies in ms, None without a sample)."""

    request_rate: float  # the Poisson rate asked for, requests/s; math.inf: all sent at once
    seed: int
    requests: int  # sent
    completed: int  # answered in full with HTTP 200
    errors: tuple[str, ...]  # the first five, then "... N errors"
    output_tokens: int  # completion_tokens of the completed requests
    duration_s: float  # from the first send to the last completion
    output_tok_per_s: float  # output_tokens / duration_s (bench_serving's output_throughput)
    request_per_s: float  # completed / duration_s
    arrival_rate: float | None  # (requests - 1) / (last send - first send); None: one request, or inf
    concurrency: float  # mean requests in flight: the sum of latencies / duration_s
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    e2e_p50_ms: float | None
    # The switch's steps over the measured requests (from the first one's send to the rate's end);
    # None: the server exports no switch counters.
    counters: SwitchCounters | None = None
    switch_threshold: int | None = None  # a learning switch's threshold at the rate's end (/metrics)

    def __post_init__(self) -> None:
        if not self.request_rate > 0:
            raise ValueError(f"a request rate must be > 0, got {self.request_rate}")

    @property
    def label(self) -> str:
        return rate_label(self.request_rate)

    @property
    def error_count(self) -> int:
        return self.requests - self.completed

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["request_rate"] = INF if math.isinf(self.request_rate) else self.request_rate
        out["errors"] = list(self.errors)
        out["counters"] = self.counters.to_json() if self.counters else None
        return {k: v for k, v in out.items() if v is not None or k not in ("counters", "switch_threshold")}

    @classmethod
    def from_json(cls, data: Any, where: str) -> OpenRateRecord:
        r = Fields(data, where)
        rate = r.get("request_rate")
        if rate != INF and (not isinstance(rate, (int, float)) or isinstance(rate, bool) or rate <= 0):
            raise ResultsError(f"{where}.request_rate: expected a number > 0 or {INF!r}, got {rate!r}")
        out = cls(
            request_rate=math.inf if rate == INF else float(rate),
            seed=r.integer("seed"),
            requests=r.integer("requests"),
            completed=r.integer("completed"),
            errors=r.texts("errors"),
            output_tokens=r.integer("output_tokens"),
            duration_s=r.number("duration_s"),
            output_tok_per_s=r.number("output_tok_per_s"),
            request_per_s=r.number("request_per_s"),
            arrival_rate=r.nullable(r.number, "arrival_rate"),
            concurrency=r.number("concurrency"),
            **{k: r.nullable(r.number, k) for k in LATENCY_KEYS},
            counters=r.opt(lambda key: SwitchCounters.from_json(r.get(key), f"{where}.{key}"), "counters"),
            switch_threshold=r.opt(r.integer, "switch_threshold"),
        )
        r.closed()
        return out


LATENCY_KEYS = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms", "itl_p99_ms", "e2e_p50_ms")


def rate_label(rate: float) -> str:
    """A rate as the tables and the plot name it: 8 for 8.0, 2.5, inf."""
    return INF if math.isinf(rate) else f"{rate:g}"


def rates_from_json(value: Any, where: str) -> tuple[OpenRateRecord, ...]:
    if not isinstance(value, list):
        raise ResultsError(f"{where}: expected a list, got {type(value).__name__}")
    return tuple(OpenRateRecord.from_json(v, f"{where}[{i}]") for i, v in enumerate(value))
