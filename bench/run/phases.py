"""What a config's running server is measured on: the closed loop's concurrency levels and the open
loop's request rates, the levels again on a second traffic, each saved to the run's results as it
ends."""

from __future__ import annotations

import logging
import sys
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from bench.configs import then_name
from bench.results import report
from bench.results.logparse import Counters, parse_metrics, parse_threshold
from bench.results.open_records import OpenRateRecord, rate_label
from bench.results.records import Analysis, ConfigRecord, LevelRecord, RunResults
from bench.results.switch_counters import SwitchCounters
from bench.run import client, host_sampling, open_loop
from bench.run.host_sampling import ServerHost
from bench.run.settings import RunSettings, RunTarget, requests_for_level

logger = logging.getLogger(__name__)


def run_levels(
    name: str, url: str, settings: RunSettings, target: RunTarget, results: RunResults, host: ServerHost | None = None
) -> ConfigRecord:
    """Measure each level in turn, saving the run after each; the config's record with its levels.
    host: what each level samples of the server on the host (its processes, its Triton compiles)."""
    for c in settings.levels:
        _append(results, target.out, name, _run_level(name, url, c, settings, target, host))
    return results.configs[name]


def run_then_levels(
    name: str, url: str, settings: RunSettings, target: RunTarget, results: RunResults, host: ServerHost | None = None
) -> ConfigRecord:
    """The levels again with --then-prompts on the same server (whatever a learning switch learned
    stays), recorded as then_name(name) and compared with its references' own second traffic."""
    first = results.configs[name]
    then = then_name(name)
    results.configs[then] = ConfigRecord(
        flags=first.flags, env=first.env, compare_to=tuple(then_name(r) for r in first.compare_to)
    )
    return run_levels(then, url, settings, replace(target, prompts=target.then_prompts), results, host)


def _run_level(
    name: str, url: str, c: int, settings: RunSettings, target: RunTarget, host: ServerHost | None
) -> LevelRecord:
    n = requests_for_level(settings.num_requests, settings.waves, c)
    batch = target.prompts_for_level(n)
    client.flush_cache(url)
    before = parse_metrics(client.get_metrics(url))
    host_before = host.sample() if host is not None else None
    with tqdm(total=n, desc=f"[{name}] C={c}", disable=not sys.stderr.isatty(), leave=False) as bar:
        lr = client.run_level(
            url,
            batch,
            c,
            settings.sampling,
            on_done=lambda done, _: bar.update(done - bar.n),
            max_new_tokens=settings.output_lengths(c, n),
        )
    on_host = host_sampling.level_use(host_before, host.sample() if host is not None else None)
    metrics = client.get_metrics(url)
    counters, threshold = SwitchCounters.between(before, parse_metrics(metrics)), parse_threshold(metrics)
    errors = lr.errors[:5] + ([f"... {len(lr.errors)} errors"] if len(lr.errors) > 5 else [])
    logger.info(
        f"[{name}] C={c:>3} n={n:>3}: {lr.tok_per_s:9.1f} tok/s  wall {lr.wall_s:6.1f}s"
        + (f"  counters {counters.to_json()}" if counters is not None else "")
        + (f"  threshold {threshold}" if threshold is not None else "")
        + (f"  ERRORS {len(lr.errors)}: {lr.errors[0]}" if lr.errors else "")
    )
    return LevelRecord(
        concurrency=c,
        requests=n,
        output_tokens=lr.output_tokens,
        wall_s=round(lr.wall_s, 3),
        tok_per_s=round(lr.tok_per_s, 1),
        errors=tuple(errors),
        counters=counters,
        wave_tok_per_s=tuple(round(w, 1) for w in lr.wave_tok_per_s()),
        wave_send_spread_s=tuple(round(s, 4) for s in lr.wave_send_spread_s()),
        switch_threshold=threshold,
        host=on_host.processes,
        triton_compiles=on_host.triton_compiles,
    )


def run_rates(name: str, url: str, settings: RunSettings, target: RunTarget, results: RunResults) -> ConfigRecord:
    """The open loop: each request rate in turn on the config's server, saving the run after each."""
    for rate in settings.request_rates:
        _append(results, target.out, name, _run_rate(name, url, rate, settings, target))
    return results.configs[name]


def _append(results: RunResults, out: Path, name: str, measured: LevelRecord | OpenRateRecord) -> None:
    """One more level or rate on the config's record, and the run saved."""
    entry = results.configs[name]
    if isinstance(measured, LevelRecord):
        entry = replace(entry, levels=(*entry.levels, measured))
    else:
        entry = replace(entry, rates=(*entry.rates, measured))
    results.configs[name] = entry
    save(results, out, plot=False)


def _run_rate(name: str, url: str, rate: float, settings: RunSettings, target: RunTarget) -> OpenRateRecord:
    """One rate's requests, with the switch's steps over the measured ones (from /metrics)."""
    n, settle = settings.requests_for_rate(rate), settings.settling_requests(rate)
    client.flush_cache(url)  # as before each closed-loop level: no prefix cached from the last rate
    label = f"[{name}] rate={rate_label(rate)}/s"
    before: list[Counters | None] = []
    with tqdm(total=settle + n, desc=label, disable=not sys.stderr.isatty(), leave=False) as bar:
        run = open_loop.run_rate(
            url,
            target.prompts_for_level(settle + n),
            rate,
            settings.sampling,
            seed=settings.seed,
            on_done=lambda done, _: bar.update(done - bar.n),
            settle=settle,
            on_measured_start=lambda: before.append(parse_metrics(client.get_metrics(url))),
        )
    metrics = client.get_metrics(url)
    counters = SwitchCounters.between(before[0] if before else None, parse_metrics(metrics))
    rec = replace(run.record(), counters=counters, switch_threshold=parse_threshold(metrics))
    logger.info(
        f"{label} n={n}: {rec.output_tok_per_s:9.1f} tok/s  {rec.request_per_s:.2f} req/s  "
        f"arrivals {rec.arrival_rate or 0:.2f}/s  TTFT p50 {rec.ttft_p50_ms or 0:.0f} ms  "
        f"TPOT p50 {rec.tpot_p50_ms or 0:.1f} ms  wall {rec.duration_s:.1f}s"
        + (f"  counters {counters.to_json()}" if counters is not None else "")
        + (f"  threshold {rec.switch_threshold}" if rec.switch_threshold is not None else "")
        + (f"  ERRORS {rec.error_count}: {rec.errors[0]}" if rec.errors else "")
    )
    return rec


def save(results: RunResults, out: Path, plot: bool) -> tuple[Analysis, dict[str, Path | None]]:
    return report.write_all(results, out, plot=plot)
