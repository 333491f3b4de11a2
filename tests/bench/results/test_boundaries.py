"""`python -m bench boundaries` on a real run's server logs (docs/bench/sweep-trained-gpu-bound)."""

from __future__ import annotations

import shutil
import statistics
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.cli import main  # noqa: E402
from bench.results import boundaries, decode_rate, level_logs, logparse, report  # noqa: E402
from bench.results.records import LevelRecord, read_results  # noqa: E402

SWEEP = Path(__file__).resolve().parents[3] / "docs" / "bench" / "sweep-trained-gpu-bound"


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """The sweep's results.json with its servers' logs unpacked beside it, as a bench run leaves them."""
    shutil.copy(SWEEP / "results.json", tmp_path)
    with tarfile.open(SWEEP / "bench-logs.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path


def test_the_levels_missed_decompose_as_measured_by_hand(sweep: Path) -> None:
    levels = [70, 250]
    by_config = {}
    for name in ("nospec", "switch-v2"):
        text = (sweep / "logs" / f"{name}.log").read_text(errors="replace")
        parts = boundaries.level_parts(text, 8)  # levels 1, 2, 5, 10, 30, 70, 100, 250
        parts = [parts[5], parts[7]]
        by_config[name] = [boundaries.level_log(p, c, 40) for p, c in zip(parts, levels, strict=True)]
    # docs/measurements.md, 2026-12-02 (GPU): the median 40-step interval and the wave-boundary intervals
    nospec70, nospec250 = by_config["nospec"]
    switch70, switch250 = by_config["switch-v2"]
    assert statistics.median(nospec70.steady_s) == pytest.approx(0.2232, abs=5e-5)
    assert statistics.median(switch70.steady_s) == pytest.approx(0.2254, abs=5e-5)
    assert nospec70.after_prefill_s == pytest.approx((0.445, 0.439, 0.462), abs=5e-4)
    assert switch250.after_prefill_s == pytest.approx((0.989, 0.688, 0.437), abs=5e-4)
    assert nospec250.after_prefill_s == pytest.approx((0.935, 0.593, 0.449, 0.462), abs=5e-4)
    # C=70 held no switch; at C=250 speculation went on at a trough and off again
    assert switch70.turns == () and switch250.turns == (("ON", 1), ("OFF", 23))
    assert min(switch250.smaller_batches) == 23 and not switch70.smaller_batches
    assert (nospec70.prefills, nospec70.new_tokens, nospec70.cached_tokens) == (17, 2360, 8280)


@pytest.mark.parametrize("packed", ["folder", "tgz", "xz"])
def test_the_command_prints_a_table_per_config(sweep: Path, packed: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["boundaries", str(sweep)]
    if packed == "tgz":
        args = ["boundaries", str(SWEEP), "--logs", str(SWEEP / "bench-logs.tgz")]
    if packed == "xz":  # as docs/ keeps newer runs' logs
        with tarfile.open(sweep / "logs.tar.xz", "w:xz") as tar:
            tar.add(sweep / "logs", "logs")
        shutil.rmtree(sweep / "logs")
        args += ["--logs", str(sweep / "logs.tar.xz")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("`")] == ["`nospec`:", "`spec-v2`:", "`switch-v2`:"]
    assert "| 250 | 8, 0.3541 | 0.989, 0.688, 0.437 | 14 (23) | 45, 5672 / 33163 | ON at 1, OFF at 23 |" in out


def test_a_log_that_does_not_cover_the_levels_is_refused(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = sweep / "logs" / "spec-v2.log"
    log.write_text(log.read_text(errors="replace").split(boundaries.FLUSHED)[0])
    assert main(["boundaries", str(sweep)]) == 2
    assert "holds 0 cache flushes, not one per level (8)" in capsys.readouterr().err
    log.unlink()
    assert main(["boundaries", str(sweep / "results.json")]) == 2
    assert f"no server log for spec-v2 at {log}" in capsys.readouterr().err
    packed = sweep / "other.tgz"
    with tarfile.open(packed, "w:gz") as tar:
        tar.add(sweep / "logs" / "switch-v2.log", "bench-0/logs/switch-v2.log")
    assert main(["boundaries", str(sweep), "--logs", str(packed)]) == 2
    assert f"{packed} holds 0 logs/nospec.log, not one" in capsys.readouterr().err


def test_a_profile_after_the_levels_is_left_out(tmp_path: Path) -> None:
    # docs/bench/wave-start-c70: one level of C=70, then a wave-start profile of another wave
    with tarfile.open(SWEEP.parent / "wave-start-c70" / "logs.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    text = (tmp_path / "bench-0" / "logs" / "switch-v2.log").read_text(errors="replace")
    (part,) = boundaries.level_parts(text, 1)
    assert logparse.PROFILING in text and logparse.PROFILING not in part
    level = boundaries.level_log(part, 70, 40, first=True)
    # the four turns of the level's counters (results.json: 4 switches), the profile's wave's none
    assert level.turns == (("ON", 1), ("OFF", 70), ("ON", 1), ("OFF", 70))
    assert level.smaller_batches and min(level.smaller_batches) == 1


def test_a_run_cut_inside_a_level_keeps_its_recorded_levels(sweep: Path) -> None:
    # The device's time limit stops a run inside a level: its server flushed for that level, which
    # results.json never records, so the recorded levels are the first flushes', not the last.
    text = (sweep / "logs" / "switch-v2.log").read_text(errors="replace")
    parts = text.split(boundaries.FLUSHED)
    cut = boundaries.FLUSHED.join(parts[:6]) + boundaries.FLUSHED + parts[6][:2000]
    assert boundaries.level_parts(cut, 5) == boundaries.level_parts(text, 8)[:5]


def test_a_second_traffic_is_read_from_its_servers_log_past_the_first(capsys: pytest.CaptureFixture[str]) -> None:
    """--then-prompts: CONFIG-then's levels share CONFIG's server log, after CONFIG's levels. The run
    split the log where the second traffic began and counted each level's prefill batches then
    (results.json); the command finds the same levels by the cache flushes before each."""
    run_dir = SWEEP.parent / "h100-auto-then"  # docs/measurements.md, GPU 24
    assert main(["boundaries", str(run_dir), "--logs", str(run_dir / "logs.tar.xz")]) == 0
    tables = _tables_by_config(capsys.readouterr().out)
    run, _ = read_results(run_dir / "results.json")
    assert set(tables) == set(run.configs) and "switch-v2-auto-then" in tables
    for name, config in run.configs.items():
        assert tables[name] == {lv.concurrency: lv.prefill_batches for lv in config.levels}, name
    # the second traffic's prefills are not the first's: at C=30, 44 against 52
    assert tables["spec-v2-then"][30] != tables["spec-v2"][30]


def _tables_by_config(out: str) -> dict[str, dict[int, int]]:
    """Each config's prefill batches per level, as the command's tables print them."""
    tables: dict[str, dict[int, int]] = {}
    for line in out.splitlines():
        if line.startswith("`"):
            current = tables.setdefault(line.strip("`:"), {})
        elif line.startswith("| ") and line.split("|")[1].strip().isdigit():
            cells = [c.strip() for c in line.split("|")[1:-1]]
            current[int(cells[0])] = int(cells[4].split(",")[0])
    return tables


def test_the_steps_per_line_come_from_the_runs_extra_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """A run made with --extra-flags "--decode-log-interval 10" is read at 10 steps a line unless told."""
    run = SWEEP.parent / "auto-threshold-wave-tails"
    assert boundaries.logged_interval({"extra_flags": "--decode-log-interval 10"}) == 10
    assert boundaries.logged_interval({"extra_flags": "--decode-log-interval=12 --x"}) == 12
    assert boundaries.logged_interval({}) == boundaries.SGLANG_DECODE_LOG_INTERVAL
    assert main(["boundaries", str(run), "--logs", str(run / "bench-logs.tar.xz")]) == 0
    out = capsys.readouterr().out
    assert "steady 10-step intervals" in out and "| 30 | 73, 0.0505 |" in out
    assert main(["boundaries", str(run), "--logs", str(run / "bench-logs.tar.xz"), "--decode-log-interval", "40"]) == 0
    assert "| 30 | 73, 0.2022 |" in capsys.readouterr().out


def _decode_line(
    spec: int, plain: int, accept_len: float | None, tok_per_s: float = 7500.0, batch_size: int = 30
) -> str:
    accepted = f"accept len: {accept_len:.2f}, " if accept_len is not None else ""
    return (
        f"[2026-12-04 20:01:11] Decode batch, #running-req: {batch_size}, #token: 4483, token usage: 0.01, "
        f"{accepted}spec-switch: on=True spec_steps={spec} fallback_steps={plain} switches=1 threshold=30/22 "
        f"probe_steps=0, cuda graph: True, gen throughput (token/s): {tok_per_s:.2f}, #queue-req: 0"
    )


PREFILL = (
    "[2026-12-04 20:01:11] Prefill batch, #new-seq: 1, #new-token: 40, #cached-token: 0, token usage: 0.01, "
    "#running-req: 29, #queue-req: 0, input throughput (token/s): 900.00, cuda graph: False"
)


def test_a_speculative_interval_counts_the_tokens_its_steps_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    """SGLang's gen throughput counts accepted tokens: a speculative interval of C requests lasted
    steps x C x accept len / throughput, and a switch's interval mixes in its plain steps."""
    text = "\n".join([_decode_line(10, 0, 2.5), _decode_line(15, 5, 3.0), _decode_line(15, 15, None)])
    lines = logparse.parse_log(text)[0].decode
    tokens = [iv.tokens_per_request for iv in decode_rate.intervals(lines, from_start=False)]
    assert tokens == [2.5, (5 * 3.0 + 5) / 10, 1.0]
    level = boundaries.level_log(text, 30, 10)
    assert level.steady_s == pytest.approx((10 * 30 * 2.0 / 7500, 10 * 30 / 7500))
    # The wave-tails run's spec-v2 at C=30: 7 steady intervals, at its steps' 7248 tok/s x 30 / A 2.72.
    run = SWEEP.parent / "auto-threshold-wave-tails"
    assert main(["boundaries", str(run), "--logs", str(run / "bench-logs.tar.xz")]) == 0
    spec_v2 = capsys.readouterr().out.split("`spec-v2`:")[1].split("`switch-v2-auto`:")[0]
    assert "| 30 | 7, 0.1127 |" in spec_v2


def test_the_report_counts_each_levels_prefill_batches(sweep: Path) -> None:
    run, _ = read_results(sweep / "results.json")
    text = (sweep / "logs" / "nospec.log").read_text(errors="replace")
    config = level_logs.with_decode_rates(run.configs["nospec"], text)
    by_level = {lv.concurrency: lv.prefill_batches for lv in config.levels}
    assert by_level[70] == 17  # as `bench boundaries` counts it (the test above)
    parts = boundaries.level_parts(text, len(config.levels))
    assert list(by_level.values()) == [
        boundaries.level_log(part, lv.concurrency, 40).prefills for part, lv in zip(parts, config.levels, strict=True)
    ]
    assert all(LevelRecord.from_json(lv.to_json(), "level") == lv for lv in config.levels)
    run.configs["nospec"] = config
    table = report.markdown(run, report.analyse(run))
    assert "Prefill batches per level" in table
    assert "| nospec | " + " | ".join(str(n) for n in by_level.values()) + " |" in table


def test_a_log_without_a_part_per_level_counts_no_prefill_batches() -> None:
    assert (
        boundaries.prefill_batches_by_level("Prefill batch, #new-seq: 1, #new-token: 5, #cached-token: 0\n", 1) is None
    )


def test_each_prefill_batch_is_charged_what_it_added_to_a_steady_interval_of_its_kind(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An interval at bs = C (after a line at C) that held prefill batches, less the median steady
    interval of its kind of step, per prefill batch; mixed intervals and batch changes left out."""
    text = "\n".join(
        [
            _decode_line(10, 0, 2.0),  # the part's first line: its interval reaches before the part
            _decode_line(20, 0, 2.0),  # steady speculative: 10 x 30 x 2.0 / 7500 = 0.080 s
            _decode_line(30, 0, 2.0, 6000.0),  # steady: 0.100 s; the median of both 0.090 s
            PREFILL,
            PREFILL,
            _decode_line(40, 0, 2.0, 3000.0),  # 0.200 s with two prefills: (0.200 - 0.090) / 2
            _decode_line(40, 10, None),  # steady plain: 10 x 30 / 7500 = 0.040 s
            PREFILL,
            _decode_line(40, 20, None, 5000.0),  # 0.060 s with one: 0.020
            PREFILL,
            _decode_line(45, 25, 2.0, 1000.0),  # both kinds of step: left out
            _decode_line(45, 35, None, batch_size=20),
            PREFILL,
            _decode_line(45, 45, None, 1000.0),  # after a line at another batch size: left out
        ]
    )
    assert [d.prefills for d in logparse.parse_log(text)[0].decode] == [0, 0, 0, 2, 0, 1, 1, 0, 1]
    level = boundaries.level_log(text, 30, 10)
    assert level.spec_per_prefill_s == pytest.approx((0.055,))
    assert level.plain_per_prefill_s == pytest.approx((0.020,))
    assert boundaries.markdown("switch", [level], 10)[-2].endswith("| 20.0 (1) / 55.0 (1) |")
    # The H100's varied-length run: a lone prefill cost a plain server 24.7 ms at C=30 and the
    # switch, speculating there, 34.5 ms (docs/measurements.md, 2026-12-05).
    run = SWEEP.parent / "h100-auto" / "spread"
    assert main(["boundaries", str(run), "--logs", str(run / "logs.tar.xz")]) == 0
    out = capsys.readouterr().out
    assert "| 24.7 (49) / - |" in out.split("`switch-v2-auto`:")[0]
    assert "| - / 34.5 (18) |" in out.split("`switch-v2-auto`:")[1]
