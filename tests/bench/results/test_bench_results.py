"""The typed result records and their results.json form: real files load and round-trip, the
reports drawn from them are unchanged, unknown keys are kept and malformed files are clear errors (CPU, fast)."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from bench_helpers import DATA, decode_level  # noqa: E402

from bench import cli  # noqa: E402
from bench.results import level_logs, report  # noqa: E402
from bench.results.profile import ProfileSummary, ProfileWindow  # noqa: E402
from bench.results.profile_records import ProfileRecord  # noqa: E402
from bench.results.records import (  # noqa: E402
    ANALYSIS_KEYS,
    Analysis,
    ConfigRecord,
    LevelRecord,
    ResultsError,
    RunResults,
    read_results,
)
from bench.run import arguments  # noqa: E402
from bench.run import settings as run_settings  # noqa: E402

DOCS_RESULTS = sorted((ROOT / "docs" / "bench").glob("*/results.json"))
# results.json files with the results.md and results.csv that `bench report` drew from them before
# the records replaced dicts: two real runs (docs/bench) and a hand-made one of the rarer cases
# (a config that failed before its server was set up, one that failed later, a failed profile,
# errored levels, a level without decode lines).
GOLDEN = sorted((DATA / "results").glob("*/results.json"))
GOLDEN_DIR = DATA / "results"


def _json(data: Any) -> Any:
    """As JSON would give it back (tuples are lists)."""
    return json.loads(json.dumps(data))


@pytest.mark.parametrize("path", DOCS_RESULTS + GOLDEN, ids=lambda p: p.parent.name)
def test_results_files_round_trip(path: Path) -> None:
    data = json.loads(path.read_text())
    run, stored = read_results(path)
    recomputed = report.analyse(run)
    out = run.to_json(recomputed)
    assert json.loads(json.dumps(out)) == out  # to_json gives plain JSON values
    recorded = {k: v for k, v in data.items() if k not in ANALYSIS_KEYS}
    assert {k: v for k, v in out.items() if k not in ANALYSIS_KEYS} == recorded
    # The analysis keys come out as the file has them, recomputed from its configs and as read back.
    for k in ANALYSIS_KEYS:
        if k in data:
            assert out[k] == data[k], k
            assert stored.to_json()[k] == data[k], k
    # Older files have no decode_ratios: today's analysis writes an empty one.
    assert {k: out[k] for k in set(out) - set(data)} in ({}, {"decode_ratios": {}})


def test_the_docs_results_are_there() -> None:
    assert len(DOCS_RESULTS) >= 2


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.parent.name)
def test_reports_are_drawn_as_before(path: Path, tmp_path: Path) -> None:
    run = report.merge(read_results(path)[0])
    analysis, paths = report.write_all(run, tmp_path, plot=False)
    assert paths["md"] is not None and paths["csv"] is not None
    assert paths["md"].read_bytes() == (path.parent / "results.md").read_bytes()
    assert paths["csv"].read_bytes() == (path.parent / "results.csv").read_bytes()
    assert report.markdown(run, analysis) == (path.parent / "results.md").read_text()


def test_cli_report_redraws_a_real_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = GOLDEN_DIR / "profile-gpu-bound-c30" / "results.json"
    assert cli.main(["report", str(src), "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out == (src.parent / "results.md").read_text() + "\n"
    assert (tmp_path / "results.csv").read_bytes() == (src.parent / "results.csv").read_bytes()
    assert json.loads((tmp_path / "results.json").read_text()) == json.loads(src.read_text())


def _minimal() -> dict[str, Any]:
    level = {
        "concurrency": 1,
        "requests": 2,
        "output_tokens": 20,
        "wall_s": 1.0,
        "tok_per_s": 20.0,
        "errors": [],
        "counters": None,
    }
    return {
        "meta": {"model": "m"},
        "configs": {"nospec": {"flags": [], "env": {}, "compare_to": [], "levels": [level]}},
    }


def test_unknown_keys_are_kept_and_written_back() -> None:
    data = _minimal()
    data["note"] = "top"
    data["configs"]["nospec"]["gpu"] = {"name": "H200"}
    data["configs"]["nospec"]["levels"][0]["ttft_ms"] = [1.5, 2.0]
    run = RunResults.from_json(data)
    assert run.extra == {"note": "top"}
    assert run.configs["nospec"].extra == {"gpu": {"name": "H200"}}
    assert run.configs["nospec"].levels[0].extra == {"ttft_ms": [1.5, 2.0]}
    assert run.to_json() == data
    merged = report.merge(run)
    assert merged.to_json(report.analyse(merged))["note"] == "top"


@pytest.mark.parametrize(
    "edit,message",
    [
        (
            lambda d: d["configs"]["nospec"]["levels"][0].pop("tok_per_s"),
            r"configs\['nospec'\]\.levels\[0\]: no 'tok_per_s'",
        ),
        (
            lambda d: d["configs"]["nospec"]["levels"][0].update(requests="2"),
            r"levels\[0\]\.requests: expected an integer",
        ),
        (
            lambda d: d["configs"]["nospec"]["levels"][0].update(
                counters={"spec_steps": 1, "fallback_steps": 0, "switches": 0, "verify_steps": 3}
            ),
            r"levels\[0\]\.counters: unknown key\(s\) 'verify_steps'",
        ),
        (
            lambda d: d["configs"]["nospec"]["levels"][0].update(decode_tok_per_s=5.0),
            "'decode_tok_per_s' without 'decode_lines'",
        ),
        (lambda d: d["configs"]["nospec"].pop("env"), "but not all of"),
        (
            lambda d: d["configs"]["nospec"].update(graph_sets=[{"kind": "target", "sizes": [1], "seconds": 1.0}]),
            r"graph_sets\[0\]: no 'gigabytes'",
        ),
        (lambda d: d["configs"]["nospec"].update(log_counters={"rank0": None}), "key 'rank0' is not an integer"),
        (lambda d: d.update(configs=[]), "configs: expected an object"),
        (
            lambda d: d["configs"]["nospec"]["levels"][0].update(wave_tok_per_s=[10.0, "fast"]),
            r"levels\[0\]\.wave_tok_per_s: expected a list of numbers",
        ),
    ],
)
def test_malformed_results_are_clear_errors(edit: Any, message: str) -> None:
    data = _minimal()
    edit(data)
    with pytest.raises(ResultsError, match=message):
        RunResults.from_json(data)


def test_a_malformed_file_is_an_error_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _minimal()
    del data["configs"]["nospec"]["levels"][0]["wall_s"]
    (tmp_path / "results.json").write_text(json.dumps(data))
    assert cli.main(["report", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "bench: error: " in err and "results.json: results.configs['nospec'].levels[0]: no 'wall_s'" in err


def test_a_config_that_failed_before_its_server_holds_the_failure_alone() -> None:
    rec = ConfigRecord(failed="switch-v1 needs thresholds")
    assert rec.to_json() == {"failed": "switch-v1 needs thresholds"}
    assert ConfigRecord.from_json(rec.to_json(), "c") == rec
    with pytest.raises(ValueError):
        ConfigRecord(levels=(LevelRecord(1, 1, 1, 1.0, 1.0),))  # levels without flags


def test_level_records_are_frozen_and_decode_rates_make_new_ones() -> None:
    lv = LevelRecord(concurrency=10, requests=30, output_tokens=300, wall_s=1.0, tok_per_s=300.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        lv.tok_per_s = 1.0  # type: ignore[misc]
    assert "decode_lines" not in lv.to_json()
    cfg = ConfigRecord(flags=(), levels=(lv,))
    line = "[2026-11-29 20:51:13] Decode batch, #running-req: 10, cuda graph: True, gen throughput (token/s): {t}\n"
    filled = level_logs.with_decode_rates(cfg, "".join(line.format(t=t) for t in (900.0, 1500.0, 1600.0)))
    assert cfg.levels[0].decode_lines is None  # unchanged
    assert (filled.levels[0].decode_tok_per_s, filled.levels[0].decode_lines) == (1550.0, 2)
    none = level_logs.with_decode_rates(cfg, "").levels[0]
    assert none.to_json() == {**lv.to_json(), "decode_lines": 0, "decode_tok_per_s": None}


def test_profile_records_write_every_summary_field() -> None:
    s = ProfileSummary(
        window_ms=10.0,
        gpu_busy_ms=3.0,
        gpu_idle_fraction=0.7,
        kernels=4,
        top_cpu_ops=[("aten::index", 5.0, 2)],
        note="n",
    )
    rec = ProfileRecord(4, summary=s)
    fields = {k: v for k, v in s.as_dict().items() if k != "host_calls"}  # written when traced with stacks
    assert rec.to_json() == _json({"concurrency": 4, **fields})
    assert ProfileRecord.from_json(rec.to_json(), "p") == rec
    assert ProfileRecord(4, error="boom").to_json() == {"concurrency": 4, "error": "boom"}
    with pytest.raises(ValueError):
        ProfileRecord(4)
    start = ProfileRecord(4, summary=s, window=ProfileWindow.WAVE_START)
    assert start.to_json()["profiled_steps"] == "wave-start"
    assert ProfileRecord.from_json(start.to_json(), "p") == start != rec
    with pytest.raises(
        ResultsError, match=r"p\.profiled_steps: 'middle' is not a profile window \(full-batch, wave-start\)"
    ):
        ProfileRecord.from_json({**start.to_json(), "profiled_steps": "middle"}, "p")


def test_stored_analysis_reads_what_analyse_wrote() -> None:
    run = RunResults.from_json(json.loads((GOLDEN_DIR / "sweep-v1" / "results.json").read_text()))
    analysis = report.analyse(run)
    assert analysis.recommendation is not None and analysis.recommendation.kind == "crossover"
    assert Analysis.from_json(_json(run.to_json(analysis))) == analysis
    assert Analysis.from_json({"configs": {}}) == Analysis()


def test_run_settings_apply_the_quick_defaults() -> None:
    quick = run_settings.RunSettings.from_args(arguments.parse(["--quick"]))
    assert (quick.levels, quick.num_requests, quick.waves, quick.max_new_tokens) == (
        tuple(arguments.QUICK_LEVELS),
        10,
        1,
        128,
    )
    full = run_settings.RunSettings.from_args(arguments.parse(["--no-ignore-eos", "--switch-thresholds", "8,6"]))
    assert (full.levels, full.num_requests, full.waves, full.max_new_tokens) == (
        tuple(arguments.FULL_LEVELS),
        30,
        3,
        512,
    )
    assert full.sampling == {"temperature": 0.0, "max_new_tokens": 512, "ignore_eos": False}
    assert full.switch_thresholds == (8, 6)
    with pytest.raises(dataclasses.FrozenInstanceError):
        full.tp = 2  # type: ignore[misc]


def test_wave_rates_round_trip_and_their_spread_is_reported() -> None:
    waves = (1850.0, 1903.5, 1880.0)
    level = LevelRecord(
        concurrency=10, requests=30, output_tokens=15360, wall_s=8.2, tok_per_s=1873.2, wave_tok_per_s=waves
    )
    assert LevelRecord.from_json(_json(level.to_json()), "level") == level
    assert "wave_tok_per_s" not in dataclasses.replace(level, wave_tok_per_s=()).to_json()  # older runs have none
    run = RunResults(meta={}, configs={"nospec": ConfigRecord(flags=(), levels=(level,))})
    text = report.markdown(run, report.analyse(run))
    assert "| nospec | 1850-1904 (3%) |" in text


def test_wave_send_spans_round_trip_and_the_longest_is_reported_beside_the_waves() -> None:
    level = LevelRecord(
        concurrency=70,
        requests=210,
        output_tokens=53760,
        wall_s=5.3,
        tok_per_s=10140.5,
        wave_tok_per_s=(10896.6, 8648.8, 8017.7),
        wave_send_spread_s=(0.004, 0.1812, 0.02),
    )
    assert LevelRecord.from_json(_json(level.to_json()), "level") == level
    assert "wave_send_spread_s" not in dataclasses.replace(level, wave_send_spread_s=()).to_json()
    run = RunResults(meta={}, configs={"nospec": ConfigRecord(flags=(), levels=(level,))})
    assert "| nospec | 8018-10897 (36%), sent within 181 ms |" in report.markdown(run, report.analyse(run))


def test_learned_thresholds_round_trip_and_are_reported_beside_the_crossovers() -> None:
    level = decode_level

    auto = (level(10, 2200, 3100, 12), level(30, 5300, 5900, 19))
    assert LevelRecord.from_json(_json(auto[1].to_json()), "level") == auto[1]
    assert "switch_threshold" not in level(10, 1, 1).to_json()  # configs that learn nothing have none
    run = RunResults(
        meta={},
        configs={
            "nospec": ConfigRecord(flags=(), levels=(level(10, 2000, 2100), level(30, 5400, 6000))),
            "spec-v2": ConfigRecord(
                flags=("--speculative-algorithm", "EAGLE3"), levels=(level(10, 2200, 3150), level(30, 4000, 4500))
            ),
            "switch-v2-auto": ConfigRecord(
                flags=("--speculative-disable-batch-size", "auto"), compare_to=("nospec", "spec-v2"), levels=auto
            ),
        },
    )
    text = report.markdown(run, report.analyse(run))
    decode = 10 * 3 ** (math.log(3150 / 2100) / (math.log(3150 / 2100) - math.log(4500 / 6000)))
    assert (
        f"- `switch-v2-auto` learned threshold at the end of each level: C=10: 12, C=30: 19; the run's "
        f"crossover of `spec-v2` and `nospec`: decode step C~{decode:.1f}, output C~"
    ) in text
