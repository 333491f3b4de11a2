"""The sweep `python -m bench run` makes: each configuration's server in turn, its concurrency levels,
then the report and the recommended flags (the settings come from bench.run.arguments)."""

from __future__ import annotations

import argparse
import logging
import shlex
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.configs import (
    BASELINE_NOSPEC,
    BASELINE_SPEC,
    OWN_TREES,
    Config,
    num_steps,
    parse_configs,
    repeated,
    then_name,
    write_off_above_tiers,
)
from bench.errors import BenchError, BenchUsageError
from bench.results import level_logs, profile, report
from bench.results.analysis import hysteresis
from bench.results.logparse import captured_graph_sets, parse_log
from bench.results.open_records import rate_label
from bench.results.profile_records import ProfileRecord
from bench.results.records import (
    ConfigRecord,
    RunResults,
    read_results,
)
from bench.results.switch_counters import SwitchCounters
from bench.run import ablation, client, phases
from bench.run.releases import configs_for_tree, recommended_flags
from bench.run.server import (
    PROJECT_ROOT,
    Server,
    ServerError,
    ServerSpec,
    base_flags,
    check_tree,
    missing_environ,
    missing_server_args,
    resolve_tree,
)
from bench.run.settings import RunSettings, RunTarget, run_target

logger = logging.getLogger(__name__)


def _switch_thresholds(cfg: Config, settings: RunSettings, results: RunResults) -> tuple[int, int]:
    if settings.switch_thresholds:
        return settings.switch_thresholds
    src = read_results(settings.thresholds_from)[1] if settings.thresholds_from else report.analyse(results)
    rec = src.recommendations.get(cfg.baseline) or src.recommendation
    if not rec or rec.kind == "insufficient":
        raise BenchError(
            f"{cfg.name} needs thresholds: run {BASELINE_NOSPEC} and {cfg.baseline} (or {BASELINE_SPEC}) "
            "first in the same run, or pass --switch-thresholds N,M or --thresholds-from results.json"
        )
    if rec.kind == "always":  # never switch off within the sweep
        n = max(settings.levels, default=settings.max_running_requests)
        return n, hysteresis(n)
    if rec.disable_batch_size is None or rec.enable_batch_size is None:
        raise BenchError(f"{cfg.name}: the {rec.kind} recommendation gives no thresholds")
    return rec.disable_batch_size, rec.enable_batch_size


def warm_up_levels(levels: Sequence[int]) -> list[int]:
    """The concurrencies each fresh server is warmed up at, with short requests: the powers of two
    up to the largest level, the last one capped at it.

    A server compiles a triton kernel the first time it meets a new value of a constexpr, and
    SGLang's speculative paths specialise several on the next power of two of the batch size
    (assign_extend_cache_locs and others); those compiles would otherwise land in the first wave
    of each level that reaches a new power, on the speculative servers more than on a plain one.
    """
    top = max(levels)
    return sorted({min(1 << k, top) for k in range((top - 1).bit_length() + 1)})


def server_flags(cfg: Config, settings: RunSettings, results: RunResults, out: Path) -> list[str]:
    """The server flags a config runs with in this run (thresholds and tier file resolved; the tier file written to out)."""
    flags = (
        base_flags()
        + list(cfg.flags)
        + ["--enable-metrics", "--max-running-requests", str(settings.max_running_requests)]
    )
    if cfg.switch:
        n, m = _switch_thresholds(cfg, settings, results)
        logger.info(f"[{cfg.name}] thresholds: disable above {n}, enable at <= {m}")
        flags += ["--speculative-disable-batch-size", str(n), "--speculative-enable-batch-size", str(m)]
    if cfg.adaptive_tiers:
        n, _ = _switch_thresholds(cfg, settings, results)
        steps = num_steps(cfg)
        tiers = write_off_above_tiers(out / f"{cfg.name}-tiers.json", n, steps)
        logger.info(f"[{cfg.name}] tier file {tiers}: {steps} steps up to a batch of {n}, none above")
        flags += ["--speculative-adaptive-config", str(tiers)]
    return flags + shlex.split(settings.extra_flags)


def refuse_unsupported(cfgs: list[Config], tree: Path) -> None:
    """Every config's flags must exist in the tree's SGLang (ours need the series, upstream's 0.5.11+)."""
    problems = [
        f"{c.name} needs {', '.join('--' + n.replace('_', '-') for n in missing)}"
        for c in cfgs
        if (missing := missing_server_args(tree, c.server_args_needed()))
    ]
    problems += [
        f"{c.name} needs {', '.join(missing)} (environment)"
        for c in cfgs
        if (missing := missing_environ(tree, list(c.env_needed)))
    ]
    if problems:
        raise BenchUsageError(
            f"the SGLang in {tree} lacks what these configs need: {'; '.join(problems)}. "
            "Leave them out of --configs, or point --tree at a tree that has them (the "
            "switch configs need this series' v0.5.9 line; adaptive-* need SGLang 0.5.11+, "
            "adaptive-v2-off-skip 0.5.14+, adaptive-v2-off-plain* this series' v0.5.15 line)."
        )


def run_config(cfg: Config, settings: RunSettings, target: RunTarget, results: RunResults) -> None:
    """Serve one config and sweep it; results.configs[cfg.name] holds what it measured so far."""
    flags = server_flags(cfg, settings, results, target.out)
    if cfg.speculative and not target.draft:
        raise BenchError(f"{cfg.name} needs --draft-model")
    spec = ServerSpec(target.model, target.draft, settings.tp, flags, dict(cfg.env))
    entry = results.configs[cfg.name] = ConfigRecord(flags=tuple(flags), env=dict(cfg.env), compare_to=cfg.compare_to)
    log = target.out / "logs" / f"{cfg.name}.log"
    t0 = time.monotonic()
    with Server(spec, log, cfg.tree or target.tree) as srv:
        logger.info(f"[{cfg.name}] server up in {time.monotonic() - t0:.0f}s: {srv.command}")
        entry = results.configs[cfg.name] = replace(entry, startup_s=round(time.monotonic() - t0, 1))
        for c in warm_up_levels([settings.warm_up_top]):
            client.run_level(srv.url, target.prompts_for_level(c), c, {**settings.sampling, "max_new_tokens": 8})
        if settings.freeze_gc:
            client.freeze_gc(srv.url)
            logger.info(f"[{cfg.name}] garbage collector frozen (/freeze_gc)")
        host = srv.host  # read once: it resolves the server's environment
        phases.run_levels(cfg.name, srv.url, settings, target, results, host)
        entry = phases.run_rates(cfg.name, srv.url, settings, target, results)
        for c in settings.profile_at:
            profiled = _profile(cfg.name, srv.url, c, settings, target, log)
            entry = results.configs[cfg.name] = replace(entry, profiles=(*entry.profiles, profiled))
        then_from = None
        if target.then_prompts:
            then_from = log.stat().st_size  # the second traffic's part of the log starts here
            phases.run_then_levels(cfg.name, srv.url, settings, target, results, host)
    raw = log.read_bytes()
    results.configs[cfg.name] = _with_log(entry, raw[:then_from].decode(errors="replace"))
    if then_from is not None:
        then = then_name(cfg.name)
        results.configs[then] = _with_log(results.configs[then], raw[then_from:].decode(errors="replace"))


def _with_log(entry: ConfigRecord, log_text: str) -> ConfigRecord:
    """The record with what its part of the server log says: decode rates, graph sets, counters."""
    ranks = parse_log(log_text)
    return replace(
        level_logs.with_decode_rates(entry, log_text),
        graph_sets=tuple(captured_graph_sets(log_text)),
        log_counters={r: (SwitchCounters.of(rl.counters) if rl.counters else None) for r, rl in ranks.items()},
    )


def _profile(name: str, url: str, c: int, settings: RunSettings, target: RunTarget, log: Path) -> ProfileRecord:
    traces = target.out / "profiles" / name / f"c{c}"
    window = settings.profile_window
    try:
        summary = profile.profile_level(
            url,
            target.prompts_for_level(c, offset=c),
            c,
            settings.sampling,
            out_dir=traces,
            log_path=log,
            num_steps=settings.profile_steps,
            window=window,
            with_stack=settings.profile_stacks,
        )
    except profile.ProfileError as e:
        logger.info(f"[{name}] profile at C={c} failed: {e}")
        return ProfileRecord(c, error=str(e), window=window)
    finally:
        if not settings.keep_traces:
            for f in traces.glob("*.trace.json*"):
                f.unlink()
    logger.info(
        f"[{name}] profile at C={c}: GPU idle {100 * summary.gpu_idle_fraction:.0f}% of {summary.window_ms:.1f} ms"
    )
    return ProfileRecord(c, summary=summary, window=window)


def _meta(args: argparse.Namespace, settings: RunSettings, target: RunTarget, imported: str) -> dict[str, Any]:
    return {
        "model": target.model,
        "draft_model": target.draft,
        "fixture_preset": None if args.model else args.fixture_preset,
        "tp": settings.tp,
        "levels": ",".join(map(str, settings.levels)),
        "num_requests": settings.num_requests,
        "waves": settings.waves,
        **_open_meta(settings),
        "max_new_tokens": settings.max_new_tokens,
        **({"output_len_spread": settings.output_len_spread} if settings.output_len_spread else {}),
        "temperature": settings.temperature,
        "prompts": target.prompts_file,
        **({"then_prompts": target.then_prompts_file} if target.then_prompts_file else {}),
        "sglang": imported,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "extra_flags": settings.extra_flags,
        **({"freeze_gc": True} if settings.freeze_gc else {}),
    }


def _open_meta(settings: RunSettings) -> dict[str, Any]:
    if not settings.request_rates:
        return {}
    per_rate = f"{settings.rate_duration:g} s" if settings.rate_duration else settings.rate_requests
    return {
        "request_rates": ",".join(map(rate_label, settings.request_rates)),
        "rate_requests": per_rate,
        **({"rate_settle": f"{settings.rate_settle:g} s"} if settings.rate_settle else {}),
        "seed": settings.seed,
    }


def command(args: argparse.Namespace) -> int:
    """`python -m bench [run]`: sweep each config's levels, then report and recommend."""
    settings = RunSettings.from_args(args)
    try:
        named = parse_configs(args.configs) if args.configs else None
    except ValueError as e:
        raise BenchUsageError(str(e)) from None
    tree = resolve_tree(args.tree, args.ref)
    with tempfile.TemporaryDirectory(prefix="bench-trees-") as scratch:
        cfgs = _configs(args, named or parse_configs(",".join(configs_for_tree(tree))), tree, Path(scratch))
        return _run(args, settings, cfgs, tree)


def _configs(args: argparse.Namespace, cfgs: list[Config], tree: Path, scratch: Path) -> list[Config]:
    """The run's configs, then --without's twins of them (their trees in scratch), then --repeat's."""
    extra: list[Config] = []
    if args.without:
        undone = ablation.tree_without(tree, ablation.find_patch(args.ref, args.without), scratch)
        extra = ablation.twins(cfgs, undone, args.without_configs)
    elif args.without_configs:
        raise BenchUsageError("--without-configs names the configs --without serves again: give --without PATCH")
    if args.repeat:
        try:
            names = dict.fromkeys(name.strip() for name in args.repeat.split(",") if name.strip())
            cfgs = cfgs + [repeated(cfgs, name) for name in names]
        except ValueError as e:
            raise BenchUsageError(str(e)) from None
    return cfgs + extra


def _run(args: argparse.Namespace, settings: RunSettings, cfgs: list[Config], tree: Path) -> int:
    out = args.out or PROJECT_ROOT / "build" / "bench" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    refuse_unsupported(cfgs, tree)
    imported = check_tree(tree, require_switch=any(c.switch for c in cfgs))
    target = run_target(args, tree, out)
    results = RunResults(meta=_meta(args, settings, target, imported))
    if own := {c.name: str(c.tree) for c in cfgs if c.tree}:
        results.meta[OWN_TREES] = own  # --without's: the run's tree with one patch undone
    logger.info(
        f"bench: {len(cfgs)} config(s) x levels {list(settings.levels)}, max({settings.num_requests}, "
        f"{settings.waves} x C) requests"
        + (f", request rates {list(map(rate_label, settings.request_rates))}/s" if settings.request_rates else "")
        + f", {settings.max_new_tokens} new tokens -> {out}"
    )
    failed = _run_configs(cfgs, settings, target, results, args.time_budget)
    analysis, paths = phases.save(results, out, plot=True)
    print(report.markdown(results, analysis))
    for line in recommended_flags(analysis, tree, out):
        print(line)
    logger.info(
        "wrote "
        + ", ".join(str(p) for p in paths.values() if p)
        + ("" if paths["png"] else " (no plot: matplotlib is not installed; `python -m bench report` it elsewhere)")
    )
    return 1 if failed else 0


def _run_configs(
    cfgs: list[Config], settings: RunSettings, target: RunTarget, results: RunResults, time_budget: float | None
) -> list[str]:
    """Run each config in turn (saving after each); the names of those that failed or were skipped."""
    t_start, failed = time.monotonic(), []
    durations: list[float] = []
    for i, cfg in enumerate(cfgs, 1):
        skip = budget_verdict(time_budget, time.monotonic() - t_start, durations)
        if skip:
            logger.info(f"[{cfg.name}] skipped: {skip}")
            failed.append(cfg.name)
            continue
        logger.info(f"== config {i}/{len(cfgs)}: {cfg.name} ({cfg.help})")
        t_cfg = time.monotonic()
        try:
            run_config(cfg, settings, target, results)
        except (ServerError, client.ClientError, BenchError) as e:
            logger.info(f"[{cfg.name}] FAILED: {e}")
            results.configs[cfg.name] = replace(results.configs.get(cfg.name, ConfigRecord()), failed=str(e)[:2000])
            failed.append(cfg.name)
        durations.append(time.monotonic() - t_cfg)
        phases.save(results, target.out, plot=False)
    return failed


def budget_verdict(budget: float | None, elapsed: float, durations: list[float]) -> str | None:
    """Why the next config should not start, or None.

    A config cut off by the caller's hard limit (the device's) leaves nothing but spent time, so one
    that could not finish even as fast as the fastest config so far is not started.
    """
    if not budget:
        return None
    left = budget - elapsed
    if left <= 0:
        return f"time budget of {budget:.0f}s spent"
    if durations and left < min(durations):
        return (
            f"{left:.0f}s of the {budget:.0f}s time budget left, and no config so far took less than "
            f"{min(durations):.0f}s"
        )
    return None
