"""A level's decode-step rate at the acceptance of all its decode lines, not of its steady intervals'
(bench.results.decode_rate, level_logs.with_decode_rates; CPU, fast)."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench_helpers import DATA  # noqa: E402

from bench.results import level_logs, report  # noqa: E402
from bench.results.logparse import parse_log  # noqa: E402
from bench.results.records import ConfigRecord, LevelRecord, ResultsError  # noqa: E402

PREFILL = (
    "[2026-12-04 17:11:33] Prefill batch, #new-seq: 1, #new-token: 11, #cached-token: 0, token usage: 0.00, "
    "#running-req: 7, #queue-req: 0, input throughput (token/s): 57.29, cuda graph: False\n"
)
SPEC = (
    "[2026-12-04 17:11:48] Decode batch, #running-req: 8, #token: 1066, token usage: 0.00, accept len: {a:.2f}, "
    "accept rate: 0.67, cuda graph: True, gen throughput (token/s): {t:.2f}, #queue-req: 0\n"
)
SWITCH = (
    "[2026-12-04 17:13:51] Decode batch, #running-req: 8, #token: 775, token usage: 0.00, {accept}"
    "spec-switch: on={on} spec_steps={s} fallback_steps={f} switches=3 threshold=8/6 probe_steps=49, "
    "cuda graph: True, gen throughput (token/s): {t:.2f}, #queue-req: 0\n"
)
STEP_RATE = 1000.0  # request-steps per second at bs = 8: a speculative step's cost, whatever it accepts


def _spec_log() -> str:
    """An always-speculating server at bs = 8, each step at STEP_RATE: 3 steady intervals at accept
    len 3.0 and 9 after a prefill at 2.5 (a prefill's time lowers their tok/s, which no rate uses)."""
    text = SPEC.format(a=2.5, t=2000.0)  # the first line: no interval of its own
    for i in range(11):
        steady = i % 3 == 2
        text += "" if steady else PREFILL
        text += SPEC.format(a=3.0, t=3.0 * STEP_RATE) if steady else SPEC.format(a=2.5, t=2000.0)
    return text


def _steady_rates(text: str, batch_size: int) -> list[float]:
    """What the report took before: the steady intervals' own rates at one batch size."""
    return [
        d.gen_tok_per_s
        for d in parse_log(text)[0].decode
        if d.steady and d.batch_size == batch_size and d.gen_tok_per_s
    ]


def _level(config: ConfigRecord) -> LevelRecord:
    return config.levels[0]


def _config() -> ConfigRecord:
    return ConfigRecord(flags=("--speculative-algorithm", "EAGLE3"), levels=(LevelRecord(8, 24, 2400, 1.0, 2400.0),))


def test_the_steady_intervals_alone_overstate_a_speculative_level() -> None:
    text = _spec_log()
    steady = _steady_rates(text, 8)
    assert statistics.median(steady) == 3.0 * STEP_RATE  # the rate at the steady intervals' acceptance
    level = _level(level_logs.with_decode_rates(_config(), text))
    accept_len = (3 * 3.0 + 9 * 2.5) / 12  # every line at bs = 8, each 10 speculative steps
    assert (level.decode_tok_per_s, level.decode_lines) == (pytest.approx(accept_len * STEP_RATE, abs=0.05), 3)
    assert level.decode_accept_len == pytest.approx(accept_len, abs=5e-4)


def test_a_plain_servers_rates_are_the_steady_median() -> None:
    text = (DATA / "nospec-decode.log").read_text()
    level = _level(level_logs.with_decode_rates(_config(), text.replace("running-req: 10,", "running-req: 8,")))
    steady = _steady_rates(text, 10)
    assert (level.decode_tok_per_s, level.decode_lines) == (round(statistics.median(steady), 1), len(steady))
    assert level.decode_accept_len is None


def _switch_log() -> str:
    """A switch at bs = 8: an interval of 4 speculative steps at accept len 3.0 and 6 plain ones,
    then 10 plain steps (one printing a stale accept len), 10 speculative at 2.0, 10 plain."""
    rows = [  # (accept len, cumulative spec, fallback steps, tok/s, prefill before)
        (2.0, 10, 0, 500.0, False),
        (3.0, 14, 6, 1440.0, False),
        (2.9, 14, 16, 1000.0, False),
        (2.0, 24, 16, 900.0, True),
        (None, 24, 26, 1500.0, False),
    ]
    text = ""
    for a, s, f, t, prefill in rows:
        accept = "" if a is None else f"accept len: {a:.2f}, accept rate: 0.50, "
        text += (PREFILL if prefill else "") + SWITCH.format(accept=accept, on=s == 14, s=s, f=f, t=t)
    return text


def test_a_switch_counts_only_its_speculative_steps_at_the_levels_acceptance() -> None:
    level = _level(level_logs.with_decode_rates(_config(), _switch_log()))
    # 24 speculative steps with an accept len printed: 10 at 2.0 (the first line's, from the start),
    # 4 at 3.0, and 10 at 2.0 after a prefill; the plain interval's stale 2.9 does not count
    accept_len = (10 * 2.0 + 4 * 3.0 + 10 * 2.0) / 24
    mixed = 1440.0 * (4 * accept_len + 6) / (4 * 3.0 + 6)  # its 4 speculative steps at the level's
    # the median of the mixed interval and the two plain ones, kept as they are
    assert (level.decode_tok_per_s, level.decode_lines) == (pytest.approx(mixed, abs=0.05), 3)
    assert 1000.0 < mixed < 1440.0
    assert level.decode_accept_len == pytest.approx(accept_len, abs=5e-4)


def test_the_table_names_the_acceptance_of_its_speculative_cells() -> None:
    from bench.results.records import RunResults

    nospec = ConfigRecord(
        flags=(), levels=(LevelRecord(8, 24, 2400, 1.0, 2400.0, decode_tok_per_s=2500.0, decode_lines=9),)
    )
    run = RunResults(meta={}, configs={"nospec": nospec, "spec": level_logs.with_decode_rates(_config(), _spec_log())})
    md = report.markdown(run, report.analyse(run))
    assert "| spec | 2625 (3, A 2.62) |" in md and "| nospec | 2500 (9) |" in md
    assert "Cells with A: each steady interval's speculative steps counted at A" in md
    plain = RunResults(meta={}, configs={"nospec": nospec})
    assert "Cells with A" not in report.markdown(plain, report.analyse(plain))


def test_the_acceptance_is_kept_in_results_json_and_older_files_read_without_it() -> None:
    level = _level(level_logs.with_decode_rates(_config(), _spec_log()))
    data = level.to_json()
    assert data["decode_accept_len"] == level.decode_accept_len
    assert LevelRecord.from_json(data, "l") == level
    older = {k: v for k, v in data.items() if k != "decode_accept_len"}
    assert LevelRecord.from_json(older, "l").decode_accept_len is None
    with pytest.raises(ResultsError, match="'decode_accept_len' without 'decode_tok_per_s'"):
        LevelRecord.from_json({**data, "decode_tok_per_s": None}, "l")
