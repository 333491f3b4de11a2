"""The open loop's records in results.json and its tables in results.md, from a synthetic run (CPU, fast)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_helpers import user_results  # noqa: E402

from bench.results import open_report, report  # noqa: E402
from bench.results.fields import ResultsError  # noqa: E402
from bench.results.open_records import OpenRateRecord  # noqa: E402
from bench.results.records import ConfigRecord, RunResults, read_results  # noqa: E402
from bench.results.switch_counters import SwitchCounters  # noqa: E402

RATES = [2.0, 8.0, math.inf]


def rate(r: float, tok: float, tpot: float, ttft: float = 50.0, errors: tuple[str, ...] = ()) -> OpenRateRecord:
    return OpenRateRecord(
        request_rate=r,
        seed=1,
        requests=100,
        completed=100 - len(errors),
        errors=errors,
        output_tokens=int(tok * 10),
        duration_s=10.0,
        output_tok_per_s=tok,
        request_per_s=10.0,
        arrival_rate=None if math.isinf(r) else r * 1.02,
        concurrency=4.5,
        ttft_p50_ms=ttft,
        ttft_p99_ms=ttft * 3,
        tpot_p50_ms=tpot,
        tpot_p99_ms=tpot * 2,
        itl_p50_ms=tpot,
        itl_p99_ms=tpot * 4,
        e2e_p50_ms=1000.0,
    )


def open_run() -> RunResults:
    """nospec wins on tok/s at the higher rates, spec-v2 on TPOT at the lower; switch-v2 close to the better."""
    nospec = (rate(2, 1000, 10.0), rate(8, 4000, 12.0), rate(math.inf, 9000, 30.0))
    spec = (rate(2, 1100, 6.0), rate(8, 3500, 14.0), rate(math.inf, 7000, 40.0))
    switch = (
        replace(rate(2, 1090, 6.1), counters=SwitchCounters(97, 3, 2), switch_threshold=12),
        replace(rate(8, 3800, 12.1), counters=SwitchCounters(40, 60, 4), switch_threshold=12),
        replace(rate(math.inf, 8900, 33.0, errors=("HTTP 500: x",)), counters=SwitchCounters(0, 0, 0)),
    )
    spec_flags = ("--speculative-algorithm", "EAGLE3")
    return RunResults(
        meta={"title": "open"},
        configs={
            "nospec": ConfigRecord(flags=(), rates=nospec),
            "spec-v2": ConfigRecord(flags=spec_flags, rates=spec),
            "switch-v2": ConfigRecord(
                flags=(*spec_flags, "--speculative-disable-batch-size", "8"),
                compare_to=("nospec", "spec-v2"),
                rates=switch,
            ),
        },
    )


def test_ratios_take_the_better_reference_per_rate_and_leave_errored_rates_out() -> None:
    run = open_run()
    assert open_report.tok_ratios(run) == {"switch-v2": pytest.approx({2.0: 1090 / 1100, 8.0: 3800 / 4000})}
    assert open_report.tpot_ratios(run) == {"switch-v2": pytest.approx({2.0: 6.1 / 6.0, 8.0: 12.1 / 12.0})}


def test_markdown_tables_with_ratio_rows(tmp_path: Path) -> None:
    run = open_run()
    md = report.markdown(run, report.analyse(run))
    assert "Output tokens per second (all requests'" not in md, "no closed-loop table without levels"
    assert "Ratios below" not in md and "insufficient" not in md
    assert "| config | 2/s | 8/s | inf/s |" in md
    assert "| nospec | 1000 | 4000 | 9000 |" in md
    assert "| switch-v2 | 1090 | 3800 | 8900 (1 err) |" in md
    assert "| switch-v2 / max(nospec, spec-v2) | 0.99 | **0.95** |  |" in md
    assert "| spec-v2 | 6.0 | 14.0 | 40.0 |" in md
    assert "| switch-v2 / min(nospec, spec-v2) | 1.02 | 1.01 |  |" in md
    assert "| nospec | 50.0 / 150.0 | 50.0 / 150.0 | 50.0 / 150.0 |" in md  # TTFT p50 / p99
    assert "| switch-v2 | 2 | 2.04 | 100/100 | 10.00 | 12.2 | 6.1 | 24.4 | 4.5 |" in md
    assert "| nospec | inf |  | 100/100 |" in md
    assert "- `switch-v2` at inf/s: HTTP 500: x" in md
    # the switch's steps over the measured requests: only the configs whose server counts them
    switch_table = md.split("Switch configs: the share of decode steps that speculated")[1].split("\n\n")[1]
    assert switch_table.splitlines()[2:] == ["| switch-v2 | 97% (12) | 40% (12) |  (1 err) |"]
    slow = replace(run.configs["switch-v2"], rates=(rate(2, 1090, 6.5),))
    run.configs["switch-v2"] = slow
    assert "| switch-v2 / min(nospec, spec-v2) | **1.08** |" in report.markdown(run, report.analyse(run))


def test_a_run_without_rates_has_no_open_loop_section(tmp_path: Path) -> None:
    res = user_results()
    assert "Open loop" not in report.markdown(res, report.analyse(res))
    assert open_report.write_plot(res, tmp_path / "open-loop.png") is None


def test_results_json_keeps_the_rates_and_older_files_still_read(tmp_path: Path) -> None:
    run = open_run()
    _, paths = report.write_all(run, tmp_path)
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["configs"]["nospec"]["rates"][2]["request_rate"] == "inf"
    assert data["configs"]["nospec"]["rates"][0]["tpot_p50_ms"] == 10.0
    back, _ = read_results(tmp_path / "results.json")
    assert back.configs == run.configs
    assert "Open loop" in (tmp_path / "results.md").read_text()
    if paths["open_png"] is not None:  # only when matplotlib is installed
        assert paths["open_png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    older = user_results()
    report.write_json(older, report.analyse(older), tmp_path / "old.json")
    assert "rates" not in json.loads((tmp_path / "old.json").read_text())["configs"]["nospec"]
    assert all(c.rates == () for c in read_results(tmp_path / "old.json")[0].configs.values())


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [("request_rate", 0, "a number > 0 or 'inf'"), ("request_rate", "fast", "'inf'"), ("ttft_p50_ms", "x", "number")],
)
def test_a_bad_rate_record_names_where(key: str, value: object, message: str) -> None:
    data = rate(2, 1, 1).to_json() | {key: value}
    with pytest.raises(ResultsError, match=message) as e:
        ConfigRecord.from_json({"flags": [], "env": {}, "compare_to": [], "levels": [], "rates": [data]}, "c")
    assert "c.rates[0]" in str(e.value)
    with pytest.raises(ResultsError, match="unknown key"):
        OpenRateRecord.from_json(rate(2, 1, 1).to_json() | {"new": 1}, "r")


def test_a_rates_switch_counters_round_trip_and_are_absent_without_a_switch() -> None:
    counted = replace(rate(2, 1, 1), counters=SwitchCounters(5, 7, 1), switch_threshold=30)
    data = counted.to_json()
    assert data["counters"] == {"spec_steps": 5, "fallback_steps": 7, "switches": 1} and data["switch_threshold"] == 30
    assert OpenRateRecord.from_json(data, "r") == counted
    assert "counters" not in rate(2, 1, 1).to_json() and "switch_threshold" not in rate(2, 1, 1).to_json()
    with pytest.raises(ResultsError, match="r.counters") as e:
        OpenRateRecord.from_json(data | {"counters": {"spec_steps": 5}}, "r")
    assert "fallback_steps" in str(e.value)


def test_the_plot_draws_each_config_against_the_rates_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a stand-in for matplotlib (the project's environment may lack it): one panel per metric,
    each config's points at the rates' places, inf last; the figure saved to the path."""
    from unittest import mock

    Image = pytest.importorskip("PIL.Image")

    plt = mock.MagicMock()
    axes = [mock.MagicMock() for _ in open_report.PANELS]
    fig = mock.MagicMock()
    fig.savefig.side_effect = lambda out, format: Image.new("RGB", (4, 4)).save(out, format=format)
    plt.subplots.return_value = (fig, axes)
    mpl = mock.MagicMock(pyplot=plt)
    monkeypatch.setitem(sys.modules, "matplotlib", mpl)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", plt)
    path = tmp_path / "open-loop.png"
    assert open_report.write_plot(open_run(), path) == path
    assert fig.savefig.call_count == 1 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tok = {c.kwargs["label"]: c.args for c in axes[0].plot.call_args_list}
    assert tok["nospec"] == ((0, 1, 2), (1000, 4000, 9000)) and tok["switch-v2"] == ((0, 1, 2), (1090, 3800, 8900))
    tpot = {c.kwargs["label"]: c.args for c in axes[1].plot.call_args_list}
    assert tpot["spec-v2"] == ((0, 1, 2), (6.0, 14.0, 40.0))
    assert all(ax.set_xticks.call_args.args == (range(3), ["2", "8", "inf"]) for ax in axes)
