"""The load generator's per-wave rates (CPU, fast)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.run.client import LevelRun, Result  # noqa: E402


def _done(started: float, latency: float, tokens: int = 100, error: str | None = None) -> Result:
    return Result("p", completion_tokens=tokens, started=started, latency=latency, error=error)


def test_waves_are_the_requests_taken_c_at_a_time_over_their_own_span() -> None:
    run = LevelRun(
        2,
        4.5,
        [
            _done(0.0, 1.0),
            _done(0.1, 0.9),  # 200 tokens over 1.0 s
            _done(1.0, 2.0),
            _done(1.05, 3.5),  # 200 tokens over 3.55 s: a slow wave
            _done(4.0, 0.5),
        ],
    )  # not a whole wave: left out
    assert run.wave_tok_per_s() == pytest.approx([200.0, 200 / 3.55])


def test_a_waves_send_span_is_from_its_first_send_to_its_last() -> None:
    run = LevelRun(
        2, 4.5, [_done(0.0, 1.0), _done(0.1, 0.9), _done(1.0, 2.0), _done(1.25, 3.5), _done(4.0, 0.5)]
    )  # not a whole wave: left out
    assert run.wave_send_spread_s() == pytest.approx([0.1, 0.25])
    failed = LevelRun(2, 2.0, [_done(0.0, 1.0), _done(0.3, 1.0, error="HTTP 500"), _done(1.0, 1.0), _done(1.0, 1.0)])
    assert failed.wave_send_spread_s() == pytest.approx([0.0])


def test_a_wave_with_a_failed_request_has_no_rate() -> None:
    run = LevelRun(2, 2.0, [_done(0.0, 1.0), _done(0.0, 1.0, error="HTTP 500"), _done(1.0, 1.0), _done(1.0, 1.0)])
    assert run.wave_tok_per_s() == pytest.approx([200.0])


class _CountingServer:
    """A /generate that sleeps `delay` per request and keeps the most requests it held at once and
    the bodies it got, in arrival order."""

    def __init__(self, delay: float) -> None:
        import threading

        from bench_helpers import LocalServer

        self.bodies: list[dict[str, Any]] = []
        self.most = 0
        self._inflight = 0
        self._lock = threading.Lock()
        self._delay = delay
        self._server = LocalServer(self._answer)
        self.url = self._server.url

    def _answer(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        with self._lock:
            self.bodies.append(body)
            self._inflight += 1
            self.most = max(self.most, self._inflight)
        time.sleep(self._delay)
        with self._lock:
            self._inflight -= 1
        if body["text"] == "refuse":
            return 503, b"overloaded"
        n = body["sampling_params"]["max_new_tokens"]
        return 200, json.dumps(
            {
                "text": body["text"].upper(),
                "output_ids": list(range(n)),
                "meta_info": {"completion_tokens": n, "extra": body.get("return_logprob")},
            }
        ).encode()

    def __enter__(self) -> _CountingServer:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)


def test_a_level_keeps_concurrency_requests_in_flight_and_its_results_in_order() -> None:
    from bench.run.client import run_level

    prompts = [f"p{i}" for i in range(12)]
    calls: list[tuple[int, int]] = []
    with _CountingServer(delay=0.2) as srv:
        lr = run_level(
            srv.url,
            prompts,
            4,
            {"max_new_tokens": 3},
            extra={"rid_tag": "t"},
            extra_by_prompt={"p5": {"return_logprob": True}},
            on_done=lambda d, n: calls.append((d, n)),
        )
    assert srv.most == 4, "a closed loop of 4: never more, and the server saw all 4 at once"
    assert [r.prompt for r in lr.results] == prompts and [r.text for r in lr.results] == [p.upper() for p in prompts]
    assert all(r.output_ids == [0, 1, 2] and r.completion_tokens == 3 and not r.error for r in lr.results)
    assert {b["text"] for b in srv.bodies[:4]} == set(prompts[:4]), "the first wave is the first 4 prompts"
    assert all(b["rid_tag"] == "t" for b in srv.bodies)
    assert [r.meta["extra"] for r in lr.results].count(True) == 1 and lr.results[5].meta["extra"] is True
    assert calls == [(k, 12) for k in range(1, 13)]
    # Three waves of 4 at 0.2 s each: the fifth request starts with the second wave.
    assert lr.results[4].started >= 0.19 and lr.wall_s >= 0.6 and len(lr.wave_tok_per_s()) == 3


def test_a_level_reports_refusals_timeouts_and_a_dead_server_as_errors() -> None:
    from bench.run.client import run_level

    with _CountingServer(delay=0.3) as srv:
        lr = run_level(srv.url, ["refuse", "ok"], 2, {"max_new_tokens": 1})
        slow = run_level(srv.url, ["late"], 1, {"max_new_tokens": 1}, timeout=0.1)
    assert lr.results[0].error == "HTTP 503: overloaded" and lr.results[1].error is None
    assert lr.errors == ["HTTP 503: overloaded"] and lr.output_tokens == 1
    assert slow.results[0].error == "TimeoutError: no reply within 0.1 s"
    dead = run_level("http://127.0.0.1:1", ["x"], 1, {})
    assert dead.results[0].error is not None and dead.results[0].error.startswith("ConnectionRefusedError")
