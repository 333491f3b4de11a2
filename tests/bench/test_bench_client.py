"""The load generator's per-wave rates (CPU, fast)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.client import LevelRun, Result  # noqa: E402


def _done(started: float, latency: float, tokens: int = 100, error: str | None = None) -> Result:
    return Result("p", completion_tokens=tokens, started=started, latency=latency, error=error)


def test_waves_are_the_requests_taken_c_at_a_time_over_their_own_span() -> None:
    run = LevelRun(2, 4.5, [_done(0.0, 1.0), _done(0.1, 0.9),      # 200 tokens over 1.0 s
                            _done(1.0, 2.0), _done(1.05, 3.5),     # 200 tokens over 3.55 s: a slow wave
                            _done(4.0, 0.5)])                      # not a whole wave: left out
    assert run.wave_tok_per_s() == pytest.approx([200.0, 200 / 3.55])


def test_a_wave_with_a_failed_request_has_no_rate() -> None:
    run = LevelRun(2, 2.0, [_done(0.0, 1.0), _done(0.0, 1.0, error="HTTP 500"), _done(1.0, 1.0), _done(1.0, 1.0)])
    assert run.wave_tok_per_s() == pytest.approx([200.0])
