"""Threshold recommendation and the result writers, on synthetic sweeps (CPU, fast)."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench_helpers import LEVELS, USER_NOSPEC, USER_SPEC, levels, user_results  # noqa: E402

from bench.results import report  # noqa: E402
from bench.results.analysis import _crossing, best_of_ratios, hysteresis, recommend  # noqa: E402
from bench.results.records import Analysis, ConfigRecord, RunResults  # noqa: E402

# the H200 test machine, fixture models, exact pair (speculation wins at 1 and 16, loses at 64)
H200_NOSPEC = {1: 535.0, 16: 2090.0, 64: 19998.0}
H200_SPEC = {1: 745.0, 16: 2521.0, 64: 10361.0}


def test_user_table_speculation_never_wins() -> None:
    rec = recommend(USER_NOSPEC, USER_SPEC)
    assert rec.kind == "never"
    assert rec.crossover is None
    # the switch refuses thresholds < 1 ("--speculative-disable-batch-size must be at least 1"): the
    # primary advice is no speculation; the flags are the closest valid switch setting
    assert rec.disable_batch_size == 1 and rec.enable_batch_size == 1
    assert rec.flags == "--speculative-disable-batch-size 1 --speculative-enable-batch-size 1"
    assert "Recommended: serve without speculation" in rec.message
    assert rec.message.index("without speculation") < rec.message.index("single-request")
    assert "0.84x" in rec.message  # what a single request still costs with that setting
    assert rec.ratios[1] == pytest.approx(77.5 / 92.6)
    assert rec.ratios[250] == pytest.approx(340.9 / 772.1)


def test_h200_crossover_interpolated_on_log_axis() -> None:
    rec = recommend(H200_NOSPEC, H200_SPEC)
    assert rec.kind == "crossover"
    r16, r64 = 2521 / 2090, 10361 / 19998
    t = math.log(r16) / (math.log(r16) - math.log(r64))
    expect = math.exp(math.log(16) + t * (math.log(64) - math.log(16)))
    assert rec.crossover == pytest.approx(expect)
    assert rec.crossover is not None and 16 < rec.crossover < 64
    n = math.floor(expect)
    assert rec.disable_batch_size == n
    assert rec.enable_batch_size == hysteresis(n) < n
    assert rec.flags == f"--speculative-disable-batch-size {n} --speculative-enable-batch-size {hysteresis(n)}"


def test_crossing_is_exact_for_power_laws() -> None:
    # ratio = (c / 20) ** -0.5: crosses 1 exactly at c = 20, between 10 and 30
    assert _crossing(10, (10 / 20) ** -0.5, 30, (30 / 20) ** -0.5) == pytest.approx(20.0)


def test_always_wins() -> None:
    rec = recommend({1: 100, 10: 500, 100: 1000}, {1: 200, 10: 900, 100: 1100})
    assert rec.kind == "always" and rec.flags == "" and rec.disable_batch_size is None
    assert "every measured level" in rec.message


def test_non_monotonic_uses_first_crossing_and_says_so() -> None:
    rec = recommend({1: 100, 2: 100, 5: 100, 10: 100}, {1: 150, 2: 90, 5: 110, 10: 80})
    assert rec.kind == "crossover" and rec.crossover is not None and 1 < rec.crossover < 2
    assert rec.disable_batch_size == 1 and rec.enable_batch_size == 1
    assert any("wins again" in n for n in rec.notes)


def test_loses_low_but_wins_high_is_never_with_a_note() -> None:
    rec = recommend({1: 100, 10: 100}, {1: 90, 10: 120})
    assert rec.kind == "never" and rec.notes
    assert rec.disable_batch_size is not None and rec.enable_batch_size is not None
    assert rec.disable_batch_size >= 1 and rec.enable_batch_size >= 1


def test_never_flags_are_valid_switch_values() -> None:
    """Every threshold the analysis recommends passes the patch's own check (>= 1, enable <= disable)."""
    for nospec, spec in [({1: 100, 4: 100}, {1: 50, 4: 40}), ({2: 100, 8: 100}, {2: 99, 8: 10})]:
        rec = recommend(nospec, spec)
        assert rec.kind == "never"
        assert rec.disable_batch_size is not None and rec.enable_batch_size is not None
        assert 1 <= rec.enable_batch_size <= rec.disable_batch_size
        assert "batch-size 0" not in rec.flags
    assert "C=1 not measured; C=2 shown" in recommend({2: 100}, {2: 50}).message


def test_insufficient_and_partial_overlap() -> None:
    assert recommend({}, {1: 1.0}).kind == "insufficient"
    rec = recommend({1: 100, 5: 100, 7: 100}, {1: 200, 5: 50})  # level 7 only in one sweep
    assert rec.kind == "crossover" and set(rec.ratios) == {1, 5}


@pytest.mark.parametrize("n,m", [(0, 0), (1, 1), (2, 1), (4, 3), (8, 6), (16, 12), (23, 17), (100, 75)])
def test_hysteresis(n: int, m: int) -> None:
    assert hysteresis(n) == m
    assert m <= n and (n < 2 or m < n)


def test_best_of_ratios() -> None:
    r = best_of_ratios({1: 90, 10: 500, 30: 10}, {1: 100, 10: 400}, {1: 80, 10: 600})
    assert r == {1: pytest.approx(0.9), 10: pytest.approx(500 / 600)}  # 30: no reference


def _with_level(c: ConfigRecord, i: int, **changes: Any) -> ConfigRecord:
    levels = list(c.levels)
    levels[i] = dataclasses.replace(levels[i], **changes)
    return dataclasses.replace(c, levels=tuple(levels))


def test_writers(tmp_path: Path) -> None:
    res = user_results()
    res.configs["spec"] = _with_level(res.configs["spec"], 2, errors=("HTTP 500: boom",))
    analysis, paths = report.write_all(res, tmp_path)
    assert isinstance(analysis, Analysis) and analysis.recommendation is not None
    assert paths["json"] is not None and paths["csv"] is not None and paths["md"] is not None
    data = json.loads(paths["json"].read_text())
    assert data["recommendation"]["kind"] == "never"
    assert data["ratios"]["switch-v1"]["1"] == pytest.approx(0.97)
    assert data["ratios"]["switch-v1"]["10"] == pytest.approx(0.9)
    rows = list(csv.DictReader(paths["csv"].open()))
    assert len(rows) == 3 * len(LEVELS)
    assert set(rows[0]) == set(report.CSV_FIELDS)
    sw = [r for r in rows if r["config"] == "switch-v1"]
    assert sw[0]["ratio_to_best"] == "0.970" and sw[0]["switches"] == "2"
    assert [r for r in rows if r["config"] == "spec"][2]["errors"] == "1"
    md = paths["md"].read_text()
    assert "| config | C=1 | C=2 | C=5 | C=10 | C=30 | C=70 | C=100 | C=250 |" in md
    assert "| nospec | 93 | 160 | 292 | 457 | 711 | 784 | 762 | 772 |" in md
    assert "(1 err)" in md
    assert "| switch-v1 / max(nospec, spec) | 0.97 |" in md and "**0.90**" in md
    assert "--speculative-disable-batch-size 1 --speculative-enable-batch-size 1" in md
    assert "serve without speculation" in md
    assert "| spec / nospec | 0.84 |" in md
    if paths["png"] is not None:  # only when matplotlib is installed
        assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_keeps_the_order_configs_ran_in(tmp_path: Path) -> None:
    # `bench report` redraws the tables from results.json; they must list configs as the run did.
    res = user_results()
    res.configs = {k: res.configs[k] for k in ("switch-v1", "spec", "nospec")}
    path = report.write_json(res, report.analyse(res), tmp_path / "results.json")
    assert list(json.loads(path.read_text())["configs"]) == ["switch-v1", "spec", "nospec"]


def test_plot_is_optional(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real = builtins.__import__

    def no_mpl(name: str, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    _, paths = report.write_all(user_results(), tmp_path)
    assert paths["png"] is None and paths["open_png"] is None
    assert all(p is not None and p.is_file() for k, p in paths.items() if k not in ("png", "open_png"))


def test_merge_recomputes(tmp_path: Path) -> None:
    res = user_results()
    a = RunResults(meta=res.meta, configs={"nospec": res.configs["nospec"]})
    b = RunResults(meta={}, configs={k: v for k, v in res.configs.items() if k != "nospec"})
    merged = report.merge(a, b)
    assert list(merged.configs) == ["nospec", "spec", "switch-v1"] and merged.meta == res.meta
    analysis = report.analyse(merged)
    assert analysis.recommendation is not None and analysis.recommendation.kind == "never"
    assert "switch-v1" in analysis.ratios


def test_per_baseline_recommendations() -> None:
    res = user_results()
    res.configs["spec-v2"] = ConfigRecord(
        flags=("--speculative-algorithm", "EAGLE3"),
        levels=levels({c: USER_NOSPEC[c] * (1.3 if c <= 5 else 0.5) for c in LEVELS}),
    )
    before = res.to_json()
    analysis = report.analyse(res)
    assert res.to_json() == before  # the analysis is returned, not written into the run
    assert set(analysis.recommendations) == {"spec", "spec-v2"}  # the switch config is not a baseline
    v2 = analysis.recommendations["spec-v2"]
    assert v2.kind == "crossover" and v2.crossover is not None and 5 < v2.crossover < 10
    assert analysis.recommendation is not None and analysis.recommendation.kind == "never"
    assert "`spec-v2` vs nospec (crossover)" in report.markdown(res, analysis)


def test_a_repeated_config_reports_the_run_to_run_noise() -> None:
    from bench.configs import AGAIN, parse_configs, repeated

    cfgs = parse_configs("nospec,spec-v2")
    again = repeated(cfgs, "nospec")
    assert again.name == "nospec" + AGAIN and again.compare_to == ("nospec",) and again.flags == cfgs[0].flags
    with pytest.raises(ValueError, match="--repeat spec: not one of the run's configs"):
        repeated(cfgs, "spec")

    res = user_results()
    second = {c: v * (1.03 if c == 30 else 0.99) for c, v in USER_NOSPEC.items()}
    res.configs[again.name] = ConfigRecord(flags=(), compare_to=again.compare_to, levels=levels(second))
    analysis = report.analyse(res)
    assert analysis.ratios[again.name][30] == pytest.approx(1.03)
    assert analysis.ratios[again.name][1] == pytest.approx(0.99)
    md = report.markdown(res, analysis)
    assert "| nospec-again / max(nospec) | 0.99 |" in md
    assert (
        "Run-to-run noise, `nospec` served twice: output tok/s second/first 0.99-1.03 over the levels "
        "(at most 3.0% apart)."
    ) in md
