"""What the benchmark runs and recommends by the tree's release: the switch's configs and flags on
a tree with the switch, upstream's adaptive mode and a tier file on one without (CPU, fast)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from bench_helpers import levels

from bench.configs import (
    DEFAULT_CONFIGS,
    DEFAULT_LINE_CONFIGS,
    DEFAULT_PLAIN_CONFIGS,
    DEFAULT_UPSTREAM_CONFIGS,
    ZERO_STEP_PLAIN_DECODE,
    off_above_tiers,
)
from bench.results import report
from bench.results.records import ConfigRecord, RunResults
from bench.run.releases import configs_for_tree, fastest_off_variant, recommended_flags

ROOT = Path(__file__).resolve().parents[3]
LEVELS = [1, 2, 5, 10, 30, 70, 100, 250]
NOSPEC = {c: 100.0 * c for c in LEVELS}
# speculation pays up to C=5 and loses from C=10 on: the crossover lies between 5 and 10
SPEC_V2 = {c: NOSPEC[c] * (1.3 if c <= 5 else 0.7) for c in LEVELS}
SPEC_V1 = {c: NOSPEC[c] * (1.2 if c <= 2 else 0.6) for c in LEVELS}


def _tree(root: Path, fields: list[str], *, in_arg_groups: bool = False) -> Path:
    srt = root / "python" / "sglang" / "srt"
    where = srt / "arg_groups" / "fields" if in_arg_groups else srt
    where.mkdir(parents=True)
    (srt.parent / "__init__.py").write_text("")
    (where / ("spec.py" if in_arg_groups else "server_args.py")).write_text("".join(f"{f} = None\n" for f in fields))
    if in_arg_groups:
        (srt / "server_args.py").write_text("from sglang.srt.arg_groups.fields.spec import *\n")
    return root


SWITCH = ["speculative_disable_batch_size", "speculative_enable_batch_size"]
ADAPTIVE = ["speculative_adaptive", "speculative_adaptive_config"]


def test_the_default_configs_follow_what_the_tree_has(tmp_path: Path) -> None:
    assert configs_for_tree(_tree(tmp_path / "ours", SWITCH)) == DEFAULT_CONFIGS
    assert configs_for_tree(_tree(tmp_path / "upstream", ADAPTIVE)) == DEFAULT_UPSTREAM_CONFIGS
    assert configs_for_tree(_tree(tmp_path / "grouped", ADAPTIVE, in_arg_groups=True)) == DEFAULT_UPSTREAM_CONFIGS
    assert configs_for_tree(_tree(tmp_path / "old", [])) == DEFAULT_PLAIN_CONFIGS
    line = _tree(tmp_path / "line", ADAPTIVE)
    (line / "python" / "sglang" / "srt" / "environ.py").write_text(f"    {ZERO_STEP_PLAIN_DECODE} = EnvBool(False)\n")
    assert configs_for_tree(line) == DEFAULT_LINE_CONFIGS and "adaptive-v2-off-plain" in DEFAULT_LINE_CONFIGS


def test_the_default_configs_on_the_project_lines() -> None:
    trees = {ref: ROOT / "build" / f"sglang-{ref}" for ref in ("v0.5.9", "v0.5.15", "v0.5.23")}
    if not all((t / "python" / "sglang").is_dir() for t in trees.values()):
        pytest.skip("needs the v0.5.9, v0.5.15 and v0.5.23 trees (make apply for each)")
    assert {ref: configs_for_tree(t) for ref, t in trees.items()} == {
        "v0.5.9": DEFAULT_CONFIGS,
        "v0.5.15": DEFAULT_LINE_CONFIGS,
        "v0.5.23": DEFAULT_LINE_CONFIGS,
    }


def _analysis() -> report.Analysis:
    run = RunResults(
        meta={},
        configs={
            "nospec": ConfigRecord(flags=(), levels=levels(NOSPEC)),
            "spec": ConfigRecord(flags=("--speculative-algorithm", "EAGLE3"), levels=levels(SPEC_V1)),
            "spec-v2": ConfigRecord(flags=("--speculative-algorithm", "EAGLE3"), levels=levels(SPEC_V2)),
        },
    )
    return report.analyse(run)


def test_a_tree_without_the_switch_gets_upstreams_tier_file(tmp_path: Path) -> None:
    analysis = _analysis()
    v2 = analysis.recommendations["spec-v2"]
    assert v2.kind == "crossover" and v2.disable_batch_size is not None
    assert 5 <= v2.disable_batch_size < 10
    [line] = recommended_flags(analysis, _tree(tmp_path / "upstream", ADAPTIVE), tmp_path)
    tiers = tmp_path / "recommended-tiers.json"
    assert f"--speculative-adaptive --speculative-adaptive-config {tiers}" in line
    assert json.loads(tiers.read_text()) == off_above_tiers(v2.disable_batch_size, 3)
    assert f"up to a decode batch of {v2.disable_batch_size}," in line


def test_a_tree_with_the_switch_gets_the_switch_flags_and_no_tier_file(tmp_path: Path) -> None:
    analysis = _analysis()
    assert analysis.recommendation is not None
    lines = recommended_flags(analysis, _tree(tmp_path / "ours", SWITCH + ADAPTIVE), tmp_path)
    assert lines == [f"recommended server flags: {analysis.recommendation.flags}"]
    assert "--speculative-disable-batch-size" in lines[0]
    assert not (tmp_path / "recommended-tiers.json").exists()


def test_no_crossover_gives_the_verdict_and_no_tier_file(tmp_path: Path) -> None:
    run = RunResults(
        meta={},
        configs={
            "nospec": ConfigRecord(flags=(), levels=levels(NOSPEC)),
            "spec-v2": ConfigRecord(
                flags=("--speculative-algorithm", "EAGLE3"), levels=levels({c: v * 0.8 for c, v in NOSPEC.items()})
            ),
        },
    )
    [line] = recommended_flags(report.analyse(run), _tree(tmp_path / "upstream", ADAPTIVE), tmp_path)
    assert line.startswith("spec-v2 against nospec: speculation never pays")
    assert not (tmp_path / "recommended-tiers.json").exists()
    assert recommended_flags(report.analyse(run), _tree(tmp_path / "old", []), tmp_path) == []


def _with_off_variants(**ratios: dict[int, float]) -> report.Analysis:
    """The run above, plus the ratios of tier-file configs (and nospec's repeat) at C = 10, 30, 100."""
    return dataclasses.replace(_analysis(), ratios={name.replace("_", "-"): r for name, r in ratios.items()})


OFF = {10: 0.90, 30: 0.92, 100: 0.91}
SKIP = {10: 0.96, 30: 0.97, 100: 0.97}


def test_the_fastest_steps_zero_variant_is_named_with_its_environment(tmp_path: Path) -> None:
    plain = {10: 0.99, 30: 0.99, 100: 0.98}
    analysis = _with_off_variants(
        adaptive_v2_off=OFF,
        adaptive_v2_off_skip=SKIP,
        adaptive_v2_off_plain=plain,
        nospec_again={10: 1.01, 30: 0.99, 100: 1.0},
    )
    tier_line, line = recommended_flags(analysis, _tree(tmp_path / "v0.5.15", ADAPTIVE), tmp_path)
    assert "--speculative-adaptive-config" in tier_line
    assert "adaptive-v2-off 0.910, adaptive-v2-off-skip 0.967, adaptive-v2-off-plain 0.987" in line
    assert "fastest adaptive-v2-off-plain (SGLANG_SPEC_ZERO_STEP_PLAIN_DECODE=1), ahead by 0.020" in line
    assert line.endswith("above this run's noise (0.010: nospec against its repeat)")


def test_a_lead_within_the_noise_is_called_so_and_an_unmeasured_noise_is_asked_for() -> None:
    close = {10: 0.97, 30: 0.98, 100: 0.97}
    noisy = _with_off_variants(
        adaptive_v2_off_skip=SKIP, adaptive_v2_off_plain=close, nospec_again={10: 1.03, 30: 0.98, 100: 1.0}
    )
    [line] = fastest_off_variant(noisy)
    assert "fastest adaptive-v2-off-plain" in line and "within this run's noise (0.030" in line
    [line] = fastest_off_variant(_with_off_variants(adaptive_v2_off=OFF, adaptive_v2_off_skip=SKIP))
    # Upstream's steps=0 on a line's tree, where the plain decode is the default, needs both variables.
    assert (
        "fastest adaptive-v2-off-skip (SGLANG_SPEC_ZERO_STEP_PLAIN_DECODE=0 SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1)"
        in line
    )
    assert line.endswith("run with --repeat nospec to know whether that is above the noise")
    assert fastest_off_variant(_with_off_variants(adaptive_v2_off=OFF)) == []  # nothing to compare


def test_an_off_regime_run_without_spec_v2_still_names_the_fastest_steps_zero_variant(tmp_path: Path) -> None:
    """As the v0.5.15 comparison ran: nospec and the tier-file configs at C = 10, 30, 100 only."""
    skip = {c: NOSPEC[c] * 0.5 for c in (10, 30, 100)}
    plain = {c: NOSPEC[c] * 0.9 for c in (10, 30, 100)}
    eagle = ("--speculative-algorithm", "EAGLE3", "--speculative-adaptive")
    run = RunResults(
        meta={},
        configs={
            "nospec": ConfigRecord(flags=(), levels=levels({c: NOSPEC[c] for c in (10, 30, 100)})),
            "adaptive-v2-off-skip": ConfigRecord(flags=eagle, levels=levels(skip)),
            "adaptive-v2-off-plain": ConfigRecord(flags=eagle, levels=levels(plain)),
        },
    )
    [line] = recommended_flags(report.analyse(run), _tree(tmp_path / "v0.5.15", ADAPTIVE), tmp_path)
    assert "fastest adaptive-v2-off-plain (SGLANG_SPEC_ZERO_STEP_PLAIN_DECODE=1), ahead by 0.400" in line
    assert not (tmp_path / "recommended-tiers.json").exists()
