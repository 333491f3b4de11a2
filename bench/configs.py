"""Server configurations the benchmark compares."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

EAGLE_V1 = [
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "4",
    "--speculative-num-draft-tokens",
    "16",
]
EAGLE_V2 = [
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "4",
]
# "2-3 tok reduced speculation"
EAGLE_V1_S2 = [
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-num-steps",
    "2",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "3",
]
V2_ENV = {"SGLANG_ENABLE_SPEC_V2": "1"}
# The switch's learned thresholds (0014); the cap is its default, named so a tree without it is refused.
AUTO_SWITCH = ["--speculative-disable-batch-size", "auto", "--speculative-auto-max-batch-size", "64"]
SKIP_ZERO_STEP_DRAFT_EXTEND = "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"
# The release lines' plain-decode patch: a steps=0 batch as a plain target DECODE, its draft caught up
# when speculation comes back. On by default there: the configs that measure upstream's steps=0 set it
# to 0 (an upstream tree ignores the variable).
ZERO_STEP_PLAIN_DECODE = "SGLANG_SPEC_ZERO_STEP_PLAIN_DECODE"
UPSTREAM_STEPS0 = {ZERO_STEP_PLAIN_DECODE: "0"}


@dataclass(frozen=True)
class Config:
    name: str
    flags: list[str]
    env: dict[str, str] = field(default_factory=dict)
    switch: bool = False  # gets --speculative-{disable,enable}-batch-size
    compare_to: tuple[str, ...] = ()  # ratio: this / max(these) per level
    baseline: str = "spec"  # switch configs: thresholds from the crossover of nospec and this config
    help: str = ""
    # upstream's --speculative-adaptive (0.5.11+) with a tier file that speculates up to N and
    # runs 0 steps above (bench.cli writes it from the thresholds)
    adaptive_tiers: bool = False
    since: str = ""  # the SGLang release whose flags the config needs ("": this series' v0.5.9 line)
    env_needed: tuple[str, ...] = ()  # variables of its env the tree's SGLang must declare (environ.py)
    tree: Path | None = None  # served from this tree, not the run's (--without)

    @property
    def speculative(self) -> bool:
        return "--speculative-algorithm" in self.flags

    @property
    def needs_thresholds(self) -> bool:
        return self.switch or self.adaptive_tiers

    def server_args_needed(self) -> list[str]:
        """The ServerArgs fields behind this config's flags (the tree's SGLang must have them)."""
        names = [f[2:].replace("-", "_") for f in self.flags if f.startswith("--speculative-")]
        if self.switch:
            names += ["speculative_disable_batch_size", "speculative_enable_batch_size"]
        if self.adaptive_tiers:
            names.append("speculative_adaptive_config")
        return list(dict.fromkeys(names))


CONFIGS: dict[str, Config] = {
    c.name: c
    for c in [
        Config("nospec", [], help="plain decoding"),
        # The v1 speculative worker runs without SGLang's overlap scheduler; this baseline separates
        # that cost from the cost of the switch's fallback step.
        Config(
            "nospec-nooverlap",
            ["--disable-overlap-schedule"],
            help="plain decoding without the overlap scheduler (what the v1 worker runs under)",
        ),
        Config("spec", EAGLE_V1, help="always EAGLE-3, v1 worker, topk 4, 3 steps, 16 draft tokens"),
        Config(
            "switch-v1", EAGLE_V1, switch=True, compare_to=("nospec", "spec"), help="v1 EAGLE-3 with the dynamic switch"
        ),
        Config(
            "switch-v1-auto",
            EAGLE_V1 + AUTO_SWITCH,
            compare_to=("nospec", "spec"),
            help="v1 EAGLE-3 with the switch's thresholds learned from measured step costs",
        ),
        Config(
            "spec-v2", EAGLE_V2, V2_ENV, help="always EAGLE-3, v2 (overlap) worker, topk 1, 3 steps, 4 draft tokens"
        ),
        Config(
            "switch-v2",
            EAGLE_V2,
            V2_ENV,
            switch=True,
            compare_to=("nospec", "spec-v2"),
            baseline="spec-v2",
            help="v2 EAGLE-3 with the dynamic switch",
        ),
        Config(
            "switch-v2-auto",
            EAGLE_V2 + AUTO_SWITCH,
            V2_ENV,
            compare_to=("nospec", "spec-v2"),
            help="v2 EAGLE-3 with the switch's thresholds learned from measured step costs",
        ),
        # Upstream's load-based speculation (SGLang 0.5.11+; v2 worker, topk 1), to compare with ours.
        Config(
            "adaptive-v2",
            EAGLE_V2 + ["--speculative-adaptive"],
            UPSTREAM_STEPS0,
            compare_to=("nospec", "spec-v2"),
            since="v0.5.11",
            help="upstream --speculative-adaptive, its default tiers (SGLang 0.5.11+)",
        ),
        Config(
            "adaptive-v2-off",
            EAGLE_V2 + ["--speculative-adaptive"],
            UPSTREAM_STEPS0,
            adaptive_tiers=True,
            compare_to=("nospec", "spec-v2"),
            baseline="spec-v2",
            since="v0.5.11",
            help="upstream --speculative-adaptive with a tier file: 3 steps up to N, 0 above (SGLang 0.5.11+)",
        ),
        # The same with upstream's switch that leaves the draft out of a steps=0 batch: the cheapest
        # steps=0 step upstream has, at the cost of a stale draft after it (0.5.14+).
        Config(
            "adaptive-v2-off-skip",
            EAGLE_V2 + ["--speculative-adaptive"],
            {**UPSTREAM_STEPS0, SKIP_ZERO_STEP_DRAFT_EXTEND: "1"},
            adaptive_tiers=True,
            compare_to=("nospec", "spec-v2"),
            baseline="spec-v2",
            since="v0.5.14",
            env_needed=(SKIP_ZERO_STEP_DRAFT_EXTEND,),
            help=f"adaptive-v2-off with {SKIP_ZERO_STEP_DRAFT_EXTEND}=1: no draft extend in a steps=0 batch "
            "(SGLang 0.5.14+)",
        ),
        # Our fallback under upstream's tiers (the release lines' default): a steps=0 batch is a plain DECODE
        # on DECODE graphs with no draft work, the draft caught up in one extend when speculation comes
        # back; -skip leaves it stale instead (upstream's skip variable).
        Config(
            "adaptive-v2-off-plain",
            EAGLE_V2 + ["--speculative-adaptive"],
            {ZERO_STEP_PLAIN_DECODE: "1"},
            adaptive_tiers=True,
            compare_to=("nospec", "spec-v2"),
            baseline="spec-v2",
            since="v0.5.15",
            env_needed=(ZERO_STEP_PLAIN_DECODE,),
            help=f"adaptive-v2-off with {ZERO_STEP_PLAIN_DECODE}=1 (the release lines' default): a steps=0 "
            "batch runs as a plain decode, the draft caught up when speculation comes back",
        ),
        Config(
            "adaptive-v2-off-plain-skip",
            EAGLE_V2 + ["--speculative-adaptive"],
            {ZERO_STEP_PLAIN_DECODE: "1", SKIP_ZERO_STEP_DRAFT_EXTEND: "1"},
            adaptive_tiers=True,
            compare_to=("nospec", "spec-v2"),
            baseline="spec-v2",
            since="v0.5.15",
            env_needed=(ZERO_STEP_PLAIN_DECODE, SKIP_ZERO_STEP_DRAFT_EXTEND),
            help="adaptive-v2-off-plain with the draft left stale (no catch-up)",
        ),
        Config("spec-s2", EAGLE_V1_S2, help="reduced: v1, topk 1, 2 steps, 3 draft tokens"),
        Config(
            "switch-s2",
            EAGLE_V1_S2,
            switch=True,
            compare_to=("nospec", "spec-s2"),
            baseline="spec-s2",
            help="reduced v1 speculation with the switch",
        ),
    ]
}
DEFAULT_CONFIGS = ["nospec", "spec", "spec-v2", "switch-v1", "switch-v2"]
# A line without the switch (v0.5.15, v0.5.23): upstream's load-based speculation where it exists
# (0.5.11+), with the tier file that turns it off above the crossover this run measures.
DEFAULT_UPSTREAM_CONFIGS = ["nospec", "spec-v2", "adaptive-v2-off"]
# A line carrying our plain-decode steps=0 (the v0.5.15 and v0.5.23 lines' 0002): both steps=0
# forms under the same tier file, so the run says which to recommend.
DEFAULT_LINE_CONFIGS = [*DEFAULT_UPSTREAM_CONFIGS, "adaptive-v2-off-plain"]
DEFAULT_PLAIN_CONFIGS = ["nospec", "spec-v2"]
# The recommendation is computed from these two sweeps.
BASELINE_NOSPEC, BASELINE_SPEC = "nospec", "spec"


def parse_configs(text: str) -> list[Config]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in CONFIGS]
    if bad:
        raise ValueError(f"unknown config(s) {', '.join(bad)}; known: {', '.join(CONFIGS)}")
    # baselines first, so the switch configs can use the recommendation from this run
    return sorted((CONFIGS[n] for n in dict.fromkeys(names)), key=lambda c: c.needs_thresholds)


AGAIN = "-again"
# The run meta's map of the configs served from a tree of their own (--without) to that tree.
OWN_TREES = "trees of their own"
# A config's record for the run's second traffic (--then-prompts), served by the same server.
THEN = "-then"


def repeated(cfgs: list[Config], name: str) -> Config:
    """The config named `name` in cfgs, served again as NAME-again and compared with its first run."""
    first = [c for c in cfgs if c.name == name]
    if not first:
        raise ValueError(f"--repeat {name}: not one of the run's configs ({', '.join(c.name for c in cfgs)})")
    return replace(first[0], name=name + AGAIN, compare_to=(name,), help=f"{name} again, for the run-to-run noise")


def then_name(name: str) -> str:
    """The record of a config's levels on the second traffic (--then-prompts)."""
    return name + THEN


def first_traffic_name(name: str) -> str | None:
    """The config a second traffic's record (then_name) belongs to; None for any other record."""
    return name[: -len(THEN)] if name.endswith(THEN) else None


def steps_in(flags: list[str]) -> int:
    """The --speculative-num-steps these server flags give."""
    return int(flags[flags.index("--speculative-num-steps") + 1])


def num_steps(cfg: Config) -> int:
    """The config's --speculative-num-steps."""
    return steps_in(cfg.flags)


def declared_references(name: str, recorded: tuple[str, ...]) -> tuple[str, ...]:
    """What a config's ratio compares it with: as its results recorded, else (older results) as
    the config is defined now."""
    return recorded or (CONFIGS[name].compare_to if name in CONFIGS else ())


def default_configs(has_switch: bool, has_adaptive: bool, has_plain_decode: bool = False) -> list[str]:
    """What `python -m bench` runs without --configs on a tree with or without these flags (and
    the plain-decode steps=0 variable)."""
    if has_switch:
        return DEFAULT_CONFIGS
    if not has_adaptive:
        return DEFAULT_PLAIN_CONFIGS
    return DEFAULT_LINE_CONFIGS if has_plain_decode else DEFAULT_UPSTREAM_CONFIGS


def off_above_tiers(n: int, steps: int) -> dict[str, dict[str, list[int]]]:
    """Upstream's adaptive tier file that speculates `steps` steps up to a batch of n and none above.
    Upstream pads the batch size up to a captured graph size before it picks the tier."""
    return {"1": {"candidate_steps": [steps]}, str(n + 1): {"candidate_steps": [0]}}


def write_off_above_tiers(path: Path, n: int, steps: int) -> Path:
    """Write that tier file (what --speculative-adaptive-config reads) to path."""
    path.write_text(json.dumps(off_above_tiers(n, steps), indent=2) + "\n", encoding="utf-8")
    return path
