"""What the benchmark offers and recommends on a tree, by what its SGLang release has: this series'
switch (the v0.5.9 line) or upstream's --speculative-adaptive (0.5.11+, the later lines)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from pathlib import Path

from bench.configs import (
    AGAIN,
    BASELINE_NOSPEC,
    CONFIGS,
    ZERO_STEP_PLAIN_DECODE,
    default_configs,
    num_steps,
    write_off_above_tiers,
)
from bench.results.records import Analysis
from bench.run.server import missing_environ, missing_server_args, tree_has_switch


def configs_for_tree(tree: Path) -> list[str]:
    """The default configs for what the tree's SGLang has: the switch, or upstream's adaptive mode
    (with our plain-decode steps=0 beside upstream's where the tree carries it)."""
    return default_configs(
        tree_has_switch(tree),
        not missing_server_args(tree, ["speculative_adaptive"]),
        not missing_environ(tree, [ZERO_STEP_PLAIN_DECODE]),
    )


def recommended_flags(analysis: Analysis, tree: Path, out: Path) -> list[str]:
    """What to add to the server's command line, in the tree's own terms: the switch's thresholds on
    a tree with the switch; else upstream's adaptive mode with a tier file (written to out) that
    speculates up to the crossover this run measured for the v2 worker and not above."""
    rec = analysis.recommendation
    if tree_has_switch(tree):
        return [f"recommended server flags: {rec.flags}"] if rec and rec.flags else []
    if missing_server_args(tree, ["speculative_adaptive"]):
        return []
    # Which steps=0 variant is fastest stands on its own: an off-regime run measures it without
    # spec-v2, and a run without a crossover still says which steps=0 to run if speculation stays.
    v2 = analysis.recommendations.get("spec-v2")
    if v2 is None:
        return fastest_off_variant(analysis)
    if v2.kind != "crossover" or v2.disable_batch_size is None:
        return [f"spec-v2 against nospec: {v2.message}", *fastest_off_variant(analysis)]
    n, steps = v2.disable_batch_size, num_steps(CONFIGS["spec-v2"])
    tiers = write_off_above_tiers(out / "recommended-tiers.json", n, steps)
    return [
        f"recommended server flags (upstream's adaptive speculation: {steps} steps up to a decode batch of {n}, "
        f"none above): --speculative-adaptive --speculative-adaptive-config {tiers}",
        *fastest_off_variant(analysis),
    ]


def _mean_over(ratios: Mapping[str, Mapping[int, float]], names: list[str]) -> tuple[list[int], dict[str, float]]:
    """The concurrencies every one of names has a ratio at, and each one's mean ratio over them."""
    common = sorted(set.intersection(*(set(ratios[name]) for name in names)))
    return common, {name: statistics.fmean(ratios[name][c] for c in common) for name in names} if common else {}


def fastest_off_variant(analysis: Analysis) -> list[str]:
    """Of the tier-file configs this run measured (upstream's steps=0 with and without its draft
    extend, the v0.5.15 line's plain decode), the one with the best mean output tok/s against
    max(nospec, spec-v2), and the environment it needs; whether its lead is above the noise
    (nospec against its repeat) when the run measured that."""
    names = [c.name for c in CONFIGS.values() if c.adaptive_tiers and analysis.ratios.get(c.name)]
    if len(names) < 2:
        return []
    common, means = _mean_over(analysis.ratios, names)
    if not common:
        return []
    best = max(means, key=lambda name: means[name])
    lead = means[best] - max(v for name, v in means.items() if name != best)
    env = " ".join(f"{k}={v}" for k, v in CONFIGS[best].env.items()) or "no environment variable"
    line = (
        f"steps=0 variants, mean output tok/s / max(nospec, spec-v2) at C = {','.join(map(str, common))}: "
        + ", ".join(f"{name} {means[name]:.3f}" for name in names)
        + f"; fastest {best} ({env}), ahead by {lead:.3f}"
    )
    again = analysis.ratios.get(BASELINE_NOSPEC + AGAIN)
    if not again or not set(common) <= set(again):
        return [line + "; run with --repeat nospec to know whether that is above the noise"]
    noise = max(abs(1 - again[c]) for c in common)
    verdict = "above" if lead > noise else "within"
    return [f"{line}, {verdict} this run's noise ({noise:.3f}: nospec against its repeat)"]
