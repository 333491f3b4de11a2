"""What the benchmark runs and recommends by the tree's release: the switch's configs and flags on
a tree with the switch, upstream's adaptive mode and a tier file on one without (CPU, fast)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_helpers import levels

from bench import report
from bench.configs import DEFAULT_CONFIGS, DEFAULT_PLAIN_CONFIGS, DEFAULT_UPSTREAM_CONFIGS, off_above_tiers
from bench.releases import configs_for_tree, recommended_flags
from bench.results import ConfigRecord, RunResults

ROOT = Path(__file__).resolve().parents[2]
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


def test_the_default_configs_on_the_project_lines() -> None:
    trees = {ref: ROOT / "build" / f"sglang-{ref}" for ref in ("v0.5.9", "v0.5.15", "v0.5.23")}
    if not all((t / "python" / "sglang").is_dir() for t in trees.values()):
        pytest.skip("needs the v0.5.9, v0.5.15 and v0.5.23 trees (make apply for each)")
    assert {ref: configs_for_tree(t) for ref, t in trees.items()} == {
        "v0.5.9": DEFAULT_CONFIGS, "v0.5.15": DEFAULT_UPSTREAM_CONFIGS, "v0.5.23": DEFAULT_UPSTREAM_CONFIGS}


def _analysis() -> report.Analysis:
    run = RunResults(meta={}, configs={
        "nospec": ConfigRecord(flags=(), levels=levels(NOSPEC)),
        "spec": ConfigRecord(flags=("--speculative-algorithm", "EAGLE3"), levels=levels(SPEC_V1)),
        "spec-v2": ConfigRecord(flags=("--speculative-algorithm", "EAGLE3"), levels=levels(SPEC_V2)),
    })
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
    run = RunResults(meta={}, configs={
        "nospec": ConfigRecord(flags=(), levels=levels(NOSPEC)),
        "spec-v2": ConfigRecord(flags=("--speculative-algorithm", "EAGLE3"),
                                levels=levels({c: v * 0.8 for c, v in NOSPEC.items()})),
    })
    [line] = recommended_flags(report.analyse(run), _tree(tmp_path / "upstream", ADAPTIVE), tmp_path)
    assert line.startswith("spec-v2 against nospec: speculation never pays")
    assert not (tmp_path / "recommended-tiers.json").exists()
    assert recommended_flags(report.analyse(run), _tree(tmp_path / "old", []), tmp_path) == []
