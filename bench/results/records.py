"""Typed records of a benchmark run, and their results.json form.

The benchmark passes these records between its functions; JSON appears only at the file boundary
(`RunResults.to_json` / `RunResults.from_json`, `Analysis.to_json` / `Analysis.from_json`).

results.json:
    {"meta": {...},                        # free-form run description (model, tp, levels, started, ...)
     "configs": {name: {                   # in the order the configs ran
        "flags": [...], "env": {...}, "compare_to": [...],
        "levels": [{"concurrency", "requests", "output_tokens", "wall_s", "tok_per_s", "errors": [...],
                    "wave_tok_per_s": [...],  # each full wave's output tok/s; absent in older runs
                    "wave_send_spread_s": [...],  # each full wave's span of send times; absent in older runs
                    "counters": {"spec_steps", "fallback_steps", "switches"} | null,
                    "decode_lines", "decode_tok_per_s" | null,  # the decode pair once taken from the log
                    "decode_accept_len",  # the acceptance decode_tok_per_s is at; absent: plain steps or older runs
                    "switch_threshold",  # a learning switch's threshold at the level's end; absent: none
                    "switch_timed", "switch_sure",  # what it was learnt from (the log); absent: not logged
                    "prefill_batches"}],  # the level's prefill batches in the server's log; absent: not read
        "rates": [...],                    # open-loop request rates (bench.results.open_records); absent: none
        "startup_s", "profile": PROFILE | [PROFILE, ...],  # a list when the run profiled several levels
        # PROFILE: {"concurrency", "profiled_steps", "error"}
        #        | {"concurrency", "profiled_steps", <bench.results.profile.ProfileSummary>}
        # profiled_steps: "wave-start", or absent for the default "full-batch" (bench.results.profile.ProfileWindow)
        "graph_sets": [{"kind", "sizes", "seconds", "gigabytes"}],
        "log_counters": {rank: {"spec_steps", "fallback_steps", "switches"} | null},
        "failed": "..."}},                 # each key after "levels" only once the run got that far; a
                                           # config that failed before its server was set up holds "failed" alone
     "recommendation": {...},              # bench.results.analysis.Recommendation.as_dict(); only when nospec and spec ran
     "recommendations": {config: {...}},   # nospec vs each always-speculative config
     "ratios": {config: {concurrency: ratio}}, "decode_ratios": {config: {concurrency: ratio}}}

The last four keys are the analysis (`bench.results.report.analyse`), recomputed from the configs whenever results
are written; `RunResults.from_json` leaves them to `Analysis.from_json`. Keys this version does not know are
kept (`extra`) at the top level, in a config and in a level, and written back; in the closed records
(counters, graph sets, profiles, recommendations) they are an error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bench.results.fields import (
    Fields,
    ResultsError,
    check_extra,
    graph_set,
    int_key,
    ratios_from,
    ratios_json,
    recommendation,
    str_map,
)
from bench.results.host_use import ProcessUse
from bench.results.logparse import GraphSet
from bench.results.open_records import OpenRateRecord, rates_from_json
from bench.results.profile_records import ProfileRecord, profiles_from_json
from bench.results.recommendation import Recommendation
from bench.results.switch_counters import SwitchCounters

ANALYSIS_KEYS = ("recommendation", "recommendations", "ratios", "decode_ratios")
RateKey = Literal["tok_per_s", "decode_tok_per_s"]


@dataclass(frozen=True)
class LevelRecord:
    """One concurrency level of one config, as measured."""

    concurrency: int
    requests: int
    output_tokens: int
    wall_s: float
    tok_per_s: float
    errors: tuple[str, ...] = ()  # the first five, then "... N errors"
    counters: SwitchCounters | None = None  # None: the server exports no switch counters
    # Taken from the server's log once the server has stopped (bench.results.level_logs.with_decode_rates): both
    # None until then, and results.json then has neither key. decode_tok_per_s alone is None when no
    # steady decode line had bs = concurrency.
    decode_tok_per_s: float | None = None
    decode_lines: int | None = None
    # The acceptance decode_tok_per_s is at (bench.results.decode_rate); None: plain steps, or an older run.
    decode_accept_len: float | None = None
    wave_tok_per_s: tuple[float, ...] = ()  # each full wave's output tok/s (client.LevelRun.wave_tok_per_s)
    wave_send_spread_s: tuple[float, ...] = ()  # each full wave's span of send times (client.LevelRun)
    switch_threshold: int | None = None  # a learning switch's threshold at the level's end (/metrics)
    # What that threshold was learnt from, by its last change logged before the level's end (the
    # server's log, bench.results.learned.basis_by_level): the batch-size buckets timed in both modes,
    # and where speculation surely pays. None: no change logged in the part of the log read.
    switch_timed: tuple[int, ...] | None = None
    switch_sure: int | None = None
    # The prefill batches the server logged in the level (bench.results.boundaries): None until the log is read.
    prefill_batches: int | None = None
    host: tuple[ProcessUse, ...] = ()  # the server's processes over the level (bench.run.host_sampling)
    triton_compiles: int | None = None  # kernels Triton compiled in the level (None: not sampled, no cache)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.decode_lines is None and self.decode_tok_per_s is not None:
            raise ValueError("decode_tok_per_s without decode_lines")
        if self.decode_accept_len is not None and self.decode_tok_per_s is None:
            raise ValueError("decode_accept_len without decode_tok_per_s")
        check_extra(self, self.extra)

    def rate(self, key: RateKey) -> float | None:
        return self.tok_per_s if key == "tok_per_s" else self.decode_tok_per_s

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "output_tokens": self.output_tokens,
            "wall_s": self.wall_s,
            "tok_per_s": self.tok_per_s,
            "errors": list(self.errors),
            "counters": None if self.counters is None else self.counters.to_json(),
        }
        if self.wave_tok_per_s:
            out["wave_tok_per_s"] = list(self.wave_tok_per_s)
        if self.wave_send_spread_s:
            out["wave_send_spread_s"] = list(self.wave_send_spread_s)
        if self.switch_threshold is not None:
            out["switch_threshold"] = self.switch_threshold
        if self.switch_timed is not None:
            out["switch_timed"] = list(self.switch_timed)
        if self.switch_sure is not None:
            out["switch_sure"] = self.switch_sure
        if self.prefill_batches is not None:
            out["prefill_batches"] = self.prefill_batches
        if self.decode_lines is not None:
            out["decode_lines"] = self.decode_lines
            out["decode_tok_per_s"] = self.decode_tok_per_s
        if self.decode_accept_len is not None:
            out["decode_accept_len"] = self.decode_accept_len
        if self.host:
            out["host"] = [p.to_json() for p in self.host]
        if self.triton_compiles is not None:
            out["triton_compiles"] = self.triton_compiles
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: Any, where: str) -> LevelRecord:
        r = Fields(data, where)
        counters = r.get("counters")
        decode_lines = r.opt(r.integer, "decode_lines")
        if decode_lines is None and r.has("decode_tok_per_s"):
            raise ResultsError(f"{where}: 'decode_tok_per_s' without 'decode_lines'")
        accept_len = r.opt(r.number, "decode_accept_len")
        if accept_len is not None and r.data.get("decode_tok_per_s") is None:
            raise ResultsError(f"{where}: 'decode_accept_len' without 'decode_tok_per_s'")
        return cls(
            concurrency=r.integer("concurrency"),
            requests=r.integer("requests"),
            output_tokens=r.integer("output_tokens"),
            wall_s=r.number("wall_s"),
            tok_per_s=r.number("tok_per_s"),
            errors=r.texts("errors"),
            counters=None if counters is None else SwitchCounters.from_json(counters, f"{where}.counters"),
            decode_tok_per_s=None if decode_lines is None else r.nullable(r.number, "decode_tok_per_s"),
            decode_lines=decode_lines,
            decode_accept_len=accept_len,
            wave_tok_per_s=r.opt(r.numbers, "wave_tok_per_s") or (),
            wave_send_spread_s=r.opt(r.numbers, "wave_send_spread_s") or (),
            switch_threshold=r.opt(r.integer, "switch_threshold"),
            switch_timed=r.opt(r.integers, "switch_timed"),
            switch_sure=r.opt(r.integer, "switch_sure"),
            prefill_batches=r.opt(r.integer, "prefill_batches"),
            host=tuple(
                ProcessUse.from_json(p, f"{where}.host[{i}]") for i, p in enumerate(r.opt(r.items, "host") or [])
            ),
            triton_compiles=r.opt(r.integer, "triton_compiles"),
            extra=r.rest(),
        )


@dataclass(frozen=True)
class ConfigRecord:
    """One server configuration's part of a run: how it was served and what it measured.

    startup_s, graph_sets, log_counters and failed are None, and profiles empty, until the run gets that
    far (and their keys are then absent from results.json). `flags` is None only for a config that failed before
    its server was set up (it had no thresholds): such a record holds `failed` alone.
    """

    flags: tuple[str, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    compare_to: tuple[str, ...] = ()  # ratio: this / max(these) per level
    levels: tuple[LevelRecord, ...] = ()
    rates: tuple[OpenRateRecord, ...] = ()  # the open loop's request rates, in the order run
    startup_s: float | None = None
    profiles: tuple[ProfileRecord, ...] = ()  # one per profiled level, in the order run
    graph_sets: tuple[GraphSet, ...] | None = None  # the target's CUDA graph sets, from rank 0's log
    log_counters: Mapping[int, SwitchCounters | None] | None = None  # per rank, from the log
    failed: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.flags is None and (self.env or self.compare_to or self.levels or self.rates):
            raise ValueError("a config without flags has no env, compare_to, levels or rates either")
        check_extra(self, self.extra)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.flags is not None:
            out.update(
                flags=list(self.flags),
                env=dict(self.env),
                compare_to=list(self.compare_to),
                levels=[lv.to_json() for lv in self.levels],
            )
        if self.rates:
            out["rates"] = [r.to_json() for r in self.rates]
        if self.startup_s is not None:
            out["startup_s"] = self.startup_s
        if self.profiles:
            profiles = [p.to_json() for p in self.profiles]
            out["profile"] = profiles[0] if len(profiles) == 1 else profiles
        if self.graph_sets is not None:
            out["graph_sets"] = [
                {"kind": g.kind, "sizes": list(g.sizes), "seconds": g.seconds, "gigabytes": g.gigabytes}
                for g in self.graph_sets
            ]
        if self.log_counters is not None:
            out["log_counters"] = {
                str(rank): None if c is None else c.to_json() for rank, c in self.log_counters.items()
            }
        if self.failed is not None:
            out["failed"] = self.failed
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: Any, where: str) -> ConfigRecord:
        r = Fields(data, where)
        setup = [k for k in ("flags", "env", "compare_to", "levels") if r.has(k)]
        if setup and len(setup) < 4:
            raise ResultsError(
                f"{where}: has {', '.join(map(repr, setup))} but not all of 'flags', 'env', 'compare_to' and 'levels'"
            )
        return cls(
            flags=r.texts("flags") if setup else None,
            env=str_map(r.get("env"), f"{where}.env") if setup else {},
            compare_to=r.texts("compare_to") if setup else (),
            levels=tuple(LevelRecord.from_json(lv, f"{where}.levels[{i}]") for i, lv in enumerate(r.items("levels")))
            if setup
            else (),
            rates=rates_from_json(r.get("rates"), f"{where}.rates") if r.has("rates") else (),
            startup_s=r.opt(r.number, "startup_s"),
            profiles=profiles_from_json(r.opt(r.get, "profile"), f"{where}.profile"),
            graph_sets=tuple(graph_set(g, f"{where}.graph_sets[{i}]") for i, g in enumerate(r.items("graph_sets")))
            if r.has("graph_sets")
            else None,
            log_counters=_by_rank(r.get("log_counters"), f"{where}.log_counters") if r.has("log_counters") else None,
            failed=r.opt(r.text, "failed"),
            extra=r.rest(),
        )


@dataclass
class RunResults:
    """A run: its description and its configs, in the order they ran.

    Mutable, unlike the other records: `python -m bench` adds each config as it starts and replaces its
    record after every level, and saves the run each time, so a run cut off by the device's time limit
    still leaves on disk what it measured.
    """

    meta: dict[str, Any]
    configs: dict[str, ConfigRecord] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_extra(self, self.extra, ANALYSIS_KEYS)

    def to_json(self, analysis: Analysis | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "meta": dict(self.meta),
            "configs": {name: c.to_json() for name, c in self.configs.items()},
        }
        if analysis is not None:
            out.update(analysis.to_json())
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: Any, where: str = "results") -> RunResults:
        """The run as recorded; its analysis keys are left out (`Analysis.from_json` reads them)."""
        r = Fields(data, where)
        meta = Fields(r.get("meta"), f"{where}.meta").data if r.has("meta") else {}
        configs = Fields(r.get("configs"), f"{where}.configs").data
        r.read.update(ANALYSIS_KEYS)
        return cls(
            meta=dict(meta),
            configs={name: ConfigRecord.from_json(c, f"{where}.configs[{name!r}]") for name, c in configs.items()},
            extra=r.rest(),
        )


@dataclass(frozen=True)
class Analysis:
    """What `bench.results.report.analyse` derives from a run's configs."""

    recommendation: Recommendation | None = None  # nospec vs spec; None unless both have levels
    recommendations: Mapping[str, Recommendation] = field(default_factory=dict)  # nospec vs each always-spec config
    ratios: Mapping[str, Mapping[int, float]] = field(default_factory=dict)  # config / max(compare_to), by concurrency
    decode_ratios: Mapping[str, Mapping[int, float]] = field(default_factory=dict)  # the same for decode-step rates

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.recommendation is None else {"recommendation": self.recommendation.as_dict()}
        out["recommendations"] = {name: r.as_dict() for name, r in self.recommendations.items()}
        out["ratios"] = ratios_json(self.ratios)
        out["decode_ratios"] = ratios_json(self.decode_ratios)
        return out

    @classmethod
    def from_json(cls, data: Any, where: str = "results") -> Analysis:
        """The analysis stored in a results.json object (an absent key reads as none; the run's keys are not read)."""
        r = Fields(data, where)
        rec = r.opt(r.get, "recommendation")
        recs = r.opt(r.get, "recommendations") or {}
        return cls(
            recommendation=None if rec is None else recommendation(rec, f"{where}.recommendation"),
            recommendations={
                name: recommendation(v, f"{where}.recommendations[{name!r}]")
                for name, v in Fields(recs, f"{where}.recommendations").data.items()
            },
            ratios=ratios_from(r.opt(r.get, "ratios") or {}, f"{where}.ratios"),
            decode_ratios=ratios_from(r.opt(r.get, "decode_ratios") or {}, f"{where}.decode_ratios"),
        )


def read_results(path: Path) -> tuple[RunResults, Analysis]:
    """A results.json file: the run, and the analysis stored with it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return RunResults.from_json(data), Analysis.from_json(data)
    except (json.JSONDecodeError, ResultsError) as e:
        raise ResultsError(f"{path}: {e}") from None


def _by_rank(data: Any, where: str) -> dict[int, SwitchCounters | None]:
    r = Fields(data, where)
    return {
        int_key(k, where): None if v is None else SwitchCounters.from_json(v, f"{where}[{k!r}]")
        for k, v in r.data.items()
    }


def levels_of(run: RunResults) -> list[int]:
    """The concurrency levels any of the run's configs measured, ascending."""
    return sorted({lv.concurrency for c in run.configs.values() for lv in c.levels})
