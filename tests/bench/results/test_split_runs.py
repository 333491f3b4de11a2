"""bench.results.split_runs: a sweep split across runs keeps every ratio inside the run that measured it
(CPU, fast)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_helpers import levels  # noqa: E402

from bench import cli  # noqa: E402
from bench.results import report, split_runs  # noqa: E402
from bench.results.records import ConfigRecord, RunResults  # noqa: E402

SPEC_FLAGS = ("--speculative-algorithm", "EAGLE3")
SWITCH_FLAGS = (*SPEC_FLAGS, "--speculative-disable-batch-size", "6")


def _run(nospec: dict[int, float], switch: dict[int, float], spec: dict[int, float] | None = None) -> RunResults:
    configs = {"nospec": ConfigRecord(flags=(), levels=levels(nospec))}
    if spec is not None:
        configs["spec-v2"] = ConfigRecord(flags=SPEC_FLAGS, levels=levels(spec))
    configs["switch-v2"] = ConfigRecord(flags=SWITCH_FLAGS, compare_to=("nospec", "spec-v2"), levels=levels(switch))
    return RunResults(meta={}, configs=configs)


# Run "low" measured the low levels with both references; run "high" the high ones without spec-v2,
# on a machine whose nospec ran 10% faster at C=100 than run "low"'s.
LOW = _run(
    nospec={1: 200.0, 10: 2000.0, 100: 10000.0}, spec={1: 400.0, 10: 2100.0, 100: 5000.0}, switch={1: 396.0, 10: 1890.0}
)
HIGH = _run(nospec={100: 11000.0, 250: 20000.0}, switch={100: 10780.0, 250: 20400.0})


def _parts() -> list[split_runs.Part]:
    return [split_runs.Part(label, run, report.analyse(run)) for label, run in (("low", LOW), ("high", HIGH))]


def test_each_ratio_is_taken_inside_its_own_run() -> None:
    ratios = split_runs.ratios_by_level(_parts(), "tok_per_s")["switch-v2"]
    assert [(r.part, round(r.ratio, 3)) for r in ratios[1]] == [("low", 0.99)]  # 396 / spec-v2's 400
    assert [(r.part, round(r.ratio, 3)) for r in ratios[10]] == [("low", 0.9)]  # 1890 / spec-v2's 2100
    # against its own run's nospec (11000), not run "low"'s 10000
    assert [(r.part, round(r.ratio, 3)) for r in ratios[100]] == [("high", 0.98)]
    assert sorted(ratios) == [1, 10, 100, 250]
    # merging keeps one run per config: half the sweep's levels are lost, whichever run comes last
    assert sorted(report.analyse(report.merge(LOW, HIGH)).ratios["switch-v2"]) == [100, 250]


def test_a_reference_the_run_lacked_is_named() -> None:
    ratios = split_runs.ratios_by_level(_parts(), "tok_per_s")["switch-v2"]
    assert ratios[1][0].missing == () and ratios[250][0].missing == ("spec-v2",)
    table = split_runs.markdown(_parts())
    row = next(line for line in table.splitlines() if line.startswith("| switch-v2 |"))
    assert "0.99 (low)" in row and "**0.90** (low)" in row and "1.02 (high, vs nospec only)" in row


def test_the_baselines_spread_across_runs_is_reported_where_two_runs_measured_a_level() -> None:
    assert split_runs.baseline_spread(_parts(), "tok_per_s") == pytest.approx({100: 0.1})
    spread_row = next(line for line in split_runs.markdown(_parts()).splitlines() if "across runs" in line)
    assert spread_row.split(" | ")[3] == "10%"  # the C=100 column


def _write_run(run: RunResults, folder: Path) -> Path:
    report.write_all(run, folder, plot=False)
    return folder


def test_cli_writes_the_split_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    low, high = _write_run(LOW, tmp_path / "low"), _write_run(HIGH, tmp_path / "high")
    out = tmp_path / "split"
    assert cli.main(["report", str(low), str(high), "--split", "a split sweep", "--out", str(out)]) == 0
    text = (out / "split.md").read_text()
    assert text.startswith("# a split sweep") and "0.98 (high, vs nospec only)" in text
    assert "0.98 (high" in capsys.readouterr().out


def test_cli_refuses_runs_it_cannot_tell_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _write_run(LOW, tmp_path / "a" / "run"), _write_run(HIGH, tmp_path / "b" / "run")
    assert cli.main(["report", str(a), str(b), "--split", "t", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "repeat: run, run" in err and "own folder name" in err
    assert not (tmp_path / "o").exists()
