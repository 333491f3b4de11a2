"""The open loop's part of results.md and its plot (open-loop.png), from the configs' rate records.

The ratio rows are issue 43's test of the switch under an arrival process: at each rate, a switch
config's output tok/s over the better (higher) of its references', and its TPOT p50 over the better
(lower) of theirs. A rate with a failed request is left out of its ratios, as an errored level is
out of the closed loop's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path

from bench.configs import declared_references
from bench.results import plot
from bench.results.analysis import best_of_ratios
from bench.results.open_records import OpenRateRecord, rate_label
from bench.results.records import ConfigRecord, RunResults

TOK_TARGET = 0.97  # output tok/s ratio at or above this (issue 43)
TPOT_TARGET = 1.03  # TPOT p50 ratio at or below this
Metric = Callable[[OpenRateRecord], float | None]


def rates_of(run: RunResults) -> list[float]:
    return sorted({r.request_rate for c in run.configs.values() for r in c.rates})


def _clean(c: ConfigRecord, metric: Metric) -> dict[float, float]:
    """{rate: value} of a config's rates that completed every request and have the value."""
    out = {}
    for r in c.rates:
        v = metric(r)
        if not r.errors and v is not None and v > 0:
            out[r.request_rate] = v
    return out


def ratios(run: RunResults, metric: Metric, lower_is_better: bool = False) -> dict[str, dict[float, float]]:
    """config / the best of its references per rate: max of theirs, or min where lower is better."""
    by = {name: _clean(c, metric) for name, c in run.configs.items()}
    out: dict[str, dict[float, float]] = {}
    for name, c in run.configs.items():
        refs = [by[r] for r in declared_references(name, c.compare_to) if by.get(r)]
        rs = best_of_ratios(by[name], *refs, lower_is_better=lower_is_better)
        if rs:
            out[name] = rs
    return out


def tok_ratios(run: RunResults) -> dict[str, dict[float, float]]:
    return ratios(run, lambda r: r.output_tok_per_s)


def tpot_ratios(run: RunResults) -> dict[str, dict[float, float]]:
    return ratios(run, lambda r: r.tpot_p50_ms, lower_is_better=True)


def _header(rates: list[float]) -> list[str]:
    return ["| config | " + " | ".join(f"{rate_label(r)}/s" for r in rates) + " |", "|---|" + "---|" * len(rates)]


def _table(
    run: RunResults,
    rates: list[float],
    cell: Callable[[OpenRateRecord], str],
    rs: Mapping[str, Mapping[float, float]] | None = None,
    *,
    best: str = "max",
    off: Callable[[float], bool] = lambda x: False,
    include: Callable[[ConfigRecord], bool] = lambda c: True,
) -> list[str]:
    """One row per config with rates (of those `include` takes), then each config's ratio row (bold
    where off target)."""
    lines = _header(rates)
    for name, c in run.configs.items():
        if c.rates and include(c):
            by = {r.request_rate: r for r in c.rates}
            row = [
                cell(by[x]) + (f" ({by[x].error_count} err)" if by[x].errors else "") if x in by else "" for x in rates
            ]
            lines.append(f"| {name} | " + " | ".join(row) + " |")
    for name, per in (rs or {}).items():
        refs = ", ".join(r for r in declared_references(name, run.configs[name].compare_to) if r in run.configs)
        row = [("" if x not in per else f"**{per[x]:.2f}**" if off(per[x]) else f"{per[x]:.2f}") for x in rates]
        lines.append(f"| {name} / {best}({refs}) | " + " | ".join(row) + " |")
    return lines


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def markdown_lines(run: RunResults) -> list[str]:
    """results.md's open-loop section; none for a run without rates."""
    rates = rates_of(run)
    if not rates:
        return []
    seeds = sorted({r.seed for c in run.configs.values() for r in c.rates})
    settle = run.meta.get("rate_settle")
    settled = f" Each rate's first {settle} of arrivals were sent and not measured (--rate-settle)." if settle else ""
    return [
        f"Open loop: requests sent at Poisson arrivals of each rate (requests/s; inf: all at once; seed "
        f"{', '.join(map(str, seeds))}), each streamed, measured as SGLang's `bench_serving --request-rate`. "
        "Output tok/s: the completed requests' output tokens / the wall time from the first send to the "
        f"last completion. Ratio rows: the config / the higher of its references (below {TOK_TARGET} in bold)."
        + settled,
        "",
        *_table(run, rates, lambda r: f"{r.output_tok_per_s:.0f}", tok_ratios(run), off=lambda x: x < TOK_TARGET),
        "",
        "TPOT p50, ms: the median over completed requests of (latency - TTFT) / (output tokens - 1). "
        f"Ratio rows: the config / the lower of its references (above {TPOT_TARGET} in bold).",
        "",
        *_table(run, rates, lambda r: _ms(r.tpot_p50_ms), tpot_ratios(run), best="min", off=lambda x: x > TPOT_TARGET),
        "",
        "TTFT p50 / p99, ms: send to the first chunk with text.",
        "",
        *_table(run, rates, lambda r: f"{_ms(r.ttft_p50_ms)} / {_ms(r.ttft_p99_ms)}"),
        "",
        *_switch_lines(run, rates),
        *_detail_lines(run),
    ]


def _switch_cell(r: OpenRateRecord) -> str:
    share = r.counters.spec_share if r.counters else None
    if share is None:
        return ""
    return f"{100 * share:.0f}%" + ("" if r.switch_threshold is None else f" ({r.switch_threshold})")


def _switch_lines(run: RunResults, rates: list[float]) -> list[str]:
    """The switch configs' decode steps that speculated over each rate's measured requests."""

    def switching(c: ConfigRecord) -> bool:
        return any(r.counters for r in c.rates)

    if not any(switching(c) for c in run.configs.values()):
        return []
    return [
        "Switch configs: the share of decode steps that speculated, from the first measured send to the "
        "rate's end (the server's counters), and a learning switch's threshold at the end in brackets.",
        "",
        *_table(run, rates, _switch_cell, include=switching),
        "",
    ]


def _detail_lines(run: RunResults) -> list[str]:
    lines = [
        "Each rate: arrivals achieved (requests - 1 over the span of sends), completed/sent, request/s, "
        "TPOT p99, ITL p50/p99 (gaps between chunks, split over the tokens each brought), mean requests "
        "in flight (sum of latencies / wall time), ms.",
        "",
        "| config | rate/s | arrivals/s | done/sent | req/s | TPOT p99 | ITL p50 | ITL p99 | in flight |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in run.configs.items():
        for r in c.rates:
            arrivals = "" if r.arrival_rate is None else f"{r.arrival_rate:.2f}"
            lines.append(
                f"| {name} | {r.label} | {arrivals} | {r.completed}/{r.requests} | {r.request_per_s:.2f} | "
                f"{_ms(r.tpot_p99_ms)} | {_ms(r.itl_p50_ms)} | {_ms(r.itl_p99_ms)} | {r.concurrency:.1f} |"
            )
    errors = [
        f"- `{name}` at {r.label}/s: {'; '.join(r.errors)}"
        for name, c in run.configs.items()
        for r in c.rates
        if r.errors
    ]
    return lines + ([""] + errors if errors else []) + [""]


PANELS: tuple[tuple[str, Metric], ...] = (
    ("output tokens / s", lambda r: r.output_tok_per_s),
    ("TPOT p50, ms", lambda r: r.tpot_p50_ms),
    ("TTFT p50, ms", lambda r: r.ttft_p50_ms),
)


def write_plot(run: RunResults, path: Path) -> Path | None:
    """open-loop.png: output tok/s, TPOT p50 and TTFT p50 against the request rate, one line per
    config; None when the run has no rates or matplotlib is not installed."""
    rates = rates_of(run)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    if not rates:
        return None
    # The rates evenly spaced and named, not on a numeric axis: inf has no place on one.
    x = {rate: i for i, rate in enumerate(rates)}
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 4.5), dpi=120)
    for ax, (ylabel, metric) in zip(axes, PANELS, strict=True):
        for name, c in run.configs.items():
            pts = [(x[r.request_rate], v) for r in c.rates if (v := metric(r)) is not None and math.isfinite(v)]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=name, linestyle="--" if "switch" in name else "-")
        ax.set_xticks(range(len(rates)), [rate_label(r) for r in rates])
        ax.set_xlabel("request rate (requests / s, Poisson)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    axes[0].legend()
    fig.suptitle(run.meta.get("title") or "open loop")
    fig.tight_layout()
    plot.save_png(fig, path)
    plt.close(fig)
    return path
