"""What the benchmark offers and recommends on a tree, by what its SGLang release has: this series'
switch (the v0.5.9 line) or upstream's --speculative-adaptive (0.5.11+, the later lines)."""
from __future__ import annotations

from pathlib import Path

from bench.configs import CONFIGS, default_configs, num_steps, write_off_above_tiers
from bench.results import Analysis
from bench.server import missing_server_args, tree_has_switch


def configs_for_tree(tree: Path) -> list[str]:
    """The default configs for what the tree's SGLang has: the switch, or upstream's adaptive mode."""
    return default_configs(tree_has_switch(tree), not missing_server_args(tree, ["speculative_adaptive"]))


def recommended_flags(analysis: Analysis, tree: Path, out: Path) -> list[str]:
    """What to add to the server's command line, in the tree's own terms: the switch's thresholds on
    a tree with the switch; else upstream's adaptive mode with a tier file (written to out) that
    speculates up to the crossover this run measured for the v2 worker and not above."""
    rec = analysis.recommendation
    if tree_has_switch(tree):
        return [f"recommended server flags: {rec.flags}"] if rec and rec.flags else []
    v2 = analysis.recommendations.get("spec-v2")
    if v2 is None or missing_server_args(tree, ["speculative_adaptive"]):
        return []
    if v2.kind != "crossover" or v2.disable_batch_size is None:
        return [f"spec-v2 against nospec: {v2.message}"]
    n, steps = v2.disable_batch_size, num_steps(CONFIGS["spec-v2"])
    tiers = write_off_above_tiers(out / "recommended-tiers.json", n, steps)
    return [f"recommended server flags (upstream's adaptive speculation: {steps} steps up to a decode batch of {n}, "
            f"none above): --speculative-adaptive --speculative-adaptive-config {tiers}"]
