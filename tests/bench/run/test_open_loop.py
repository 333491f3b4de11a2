"""The open loop's client (bench.run.open_loop): bench_serving's arrivals, its streamed timings and
metric definitions, and errors, against a local streaming stand-in (CPU, a few seconds)."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_helpers import StreamingServer  # noqa: E402

from bench.run.open_loop import StreamOutput, arrival_offsets, run_rate, summarise  # noqa: E402

SAMPLING = {"temperature": 0.0, "max_new_tokens": 10, "ignore_eos": True}


def test_arrivals_are_bench_servings_exponential_draws_at_the_rate() -> None:
    offsets = arrival_offsets(20001, 8.0, seed=1)
    gaps = np.diff(offsets)
    assert offsets[0] == 0.0 and len(offsets) == 20001
    # bench_serving: np.random.seed(seed), then np.random.exponential(1 / rate) after each send
    np.random.seed(1)
    assert gaps[:50] == pytest.approx([np.random.exponential(1 / 8.0) for _ in range(50)], rel=1e-9)
    # Poisson at 8/s: exponential gaps of mean 1/8, as spread as they are long, 1 - 1/e under the mean
    assert gaps.mean() == pytest.approx(1 / 8, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.03)
    assert (gaps < gaps.mean()).mean() == pytest.approx(1 - math.exp(-1), abs=0.015)
    assert arrival_offsets(5, 8.0, seed=2) != arrival_offsets(5, 8.0, seed=1)
    assert arrival_offsets(5, 8.0, seed=1) == pytest.approx([t / 2 for t in arrival_offsets(5, 4.0, seed=1)])
    assert arrival_offsets(3, math.inf, seed=1) == [0.0, 0.0, 0.0] and arrival_offsets(0, 1.0, 1) == []


def test_requests_go_out_on_schedule_whatever_is_in_flight() -> None:
    n, rate = 40, 50.0
    reply = 0.5
    with StreamingServer(first_delay=reply) as srv:
        run = run_rate(srv.url, ["ok"] * n, rate, SAMPLING, seed=3)
    schedule = arrival_offsets(n, rate, seed=3)
    # On time as a rule, and never late by a reply's delay, which a client that waited for replies
    # would add; a loaded two-core CI machine delays a send by up to ~0.15 s (once 124 ms here).
    late = np.abs(np.array([o.start_time for o in run.outputs]) - schedule)
    assert np.median(late) < 0.01 and late.max() < reply / 2
    assert srv.most >= 5, "an open loop does not wait for replies: requests pile up behind a slow server"
    came = np.array(srv.arrivals) - schedule  # the server's clock: its times up to a shift
    came = np.abs(came - np.median(came))
    assert np.median(came) < 0.01 and came.max() < reply / 2
    rec = run.record()
    assert rec.completed == n and not rec.errors and rec.output_tokens == 10 * n
    assert rec.arrival_rate == pytest.approx((n - 1) / schedule[-1], rel=0.15)
    assert rec.output_tok_per_s == pytest.approx(10 * n / run.duration_s, rel=1e-3)
    assert run.duration_s >= schedule[-1] + reply


def test_settling_requests_are_sent_and_answered_but_not_measured() -> None:
    n, settle, rate = 12, 8, 40.0
    with StreamingServer(first_delay=0.05) as srv:
        run = run_rate(srv.url, ["ok"] * n, rate, SAMPLING, seed=3, settle=settle)
        with pytest.raises(ValueError, match="settle must leave requests to measure: 12 of 12"):
            run_rate(srv.url, ["ok"] * n, rate, SAMPLING, settle=n)
    schedule = arrival_offsets(n, rate, seed=3)
    assert len(srv.arrivals) == n and len(run.outputs) == n - settle
    starts = [o.start_time for o in run.outputs]
    assert starts == sorted(starts) and abs(starts[0] - schedule[settle]) < 0.05
    # from the first measured send, not from the first settling one
    assert run.duration_s < schedule[-1] - schedule[settle] + 0.5
    assert run.duration_s >= schedule[-1] - schedule[settle] + 0.05
    rec = run.record()
    assert rec.requests == rec.completed == n - settle and rec.output_tokens == 10 * (n - settle)


def test_ttft_tpot_and_itl_of_a_server_with_known_delays() -> None:
    with StreamingServer(first_delay=0.15, chunk_delay=0.01) as srv:
        rec = run_rate(srv.url, ["ok"] * 4, 20.0, {**SAMPLING, "max_new_tokens": 20}, seed=1).record()
    assert rec.completed == 4 and rec.output_tokens == 80
    assert rec.ttft_p50_ms is not None and 150 <= rec.ttft_p50_ms < 200
    assert rec.tpot_p50_ms is not None and 10 <= rec.tpot_p50_ms < 14
    assert rec.itl_p50_ms is not None and 10 <= rec.itl_p50_ms < 14
    assert rec.e2e_p50_ms is not None and rec.e2e_p50_ms >= 150 + 19 * 10


def test_a_chunk_of_several_tokens_splits_its_gap_over_them() -> None:
    with StreamingServer(chunk_delay=0.04, tokens_per_chunk=4) as srv:
        run = run_rate(srv.url, ["ok"], 1.0, {**SAMPLING, "max_new_tokens": 12}, seed=1)
    out = run.outputs[0]
    assert out.success and out.output_len == 12 and len(out.itl) == 8  # two chunks after the first, 4 each
    # each chunk's gap (0.04 s) split evenly over its 4 tokens
    assert len(set(out.itl[:4])) == 1 and len(set(out.itl[4:])) == 1
    # two gaps of 0.04 s as the client sees them: a first chunk that reached it late shortens the span
    # (CI's two cores once read 0.0725 s), the machine's own delays lengthen it
    assert 0.06 <= 4 * (out.itl[0] + out.itl[4]) < 0.12
    # one token's share of a gap, not the whole gap
    assert out.itl[0] < 0.03 and out.itl[4] < 0.03


def test_metrics_are_calculate_metrics_definitions() -> None:
    outputs = [
        StreamOutput(True, latency=1.0, ttft=0.1, itl=[0.1] * 9, output_len=10, start_time=0.0),
        StreamOutput(True, latency=0.5, ttft=0.3, itl=[], output_len=1, start_time=0.5),  # no TPOT: one token
        StreamOutput(False, latency=0.1, error="HTTP 500: boom", start_time=1.0),
    ]
    rec = summarise(4.0, 7, outputs, duration_s=2.0)
    assert (rec.requests, rec.completed, rec.errors, rec.output_tokens) == (3, 2, ("HTTP 500: boom",), 11)
    assert (rec.output_tok_per_s, rec.request_per_s, rec.arrival_rate, rec.concurrency) == (5.5, 1.0, 2.0, 0.75)
    assert rec.tpot_p50_ms == pytest.approx(100.0) and rec.tpot_p99_ms == pytest.approx(100.0)
    # numpy's percentiles over the completed requests' TTFTs, 0.1 and 0.3 s
    assert rec.ttft_p50_ms == pytest.approx(200.0) and rec.ttft_p99_ms == pytest.approx(298.0)
    assert rec.itl_p50_ms == pytest.approx(100.0) and rec.e2e_p50_ms == pytest.approx(750.0)
    none = summarise(1.0, 1, [StreamOutput(False, error="x")], duration_s=0.5)
    assert none.completed == 0 and none.ttft_p50_ms is None and none.tpot_p50_ms is None and none.arrival_rate is None
    many = summarise(1.0, 1, [StreamOutput(False, error=f"e{i}") for i in range(7)], duration_s=1.0)
    assert many.errors[-1] == "... 7 errors" and many.error_count == 7


def test_a_500_a_stream_error_and_a_dead_server_are_errors_not_crashes() -> None:
    prompts = ["ok", "fail", "error-chunk", "no-token", "ok", "garbled"]
    with StreamingServer() as srv:
        run = run_rate(srv.url, prompts, math.inf, SAMPLING)
    errors = [o.error for o in run.outputs]
    assert errors[0] == errors[4] == "" and errors[1] == "HTTP 500: boom"
    assert errors[2].startswith("stream error:") and "bad" in errors[2]
    assert errors[3] == "the stream ended without a token" and errors[5].startswith("JSONDecodeError")
    rec = run.record()
    assert rec.completed == 2 and rec.error_count == 4 and rec.output_tokens == 20
    assert rec.arrival_rate is None, "all sent at once: no arrival rate to speak of"
    t0 = time.perf_counter()
    dead = run_rate("http://127.0.0.1:1", ["ok", "ok"], math.inf, SAMPLING).record()
    assert dead.completed == 0 and all("ConnectionRefused" in e or "Connect" in e for e in dead.errors)
    assert time.perf_counter() - t0 < 5


def _sglang_calculate_metrics() -> Any:
    """calculate_metrics from the SGLang tree's own bench_serving.py ($SGLANG_TREE, else the pinned
    line's build/sglang-v0.5.9), compiled alone: the module itself imports `datasets`, which this
    environment lacks."""
    import ast
    import dataclasses
    import os
    import typing
    import warnings

    root = Path(__file__).resolve().parents[3]
    tree = Path(os.environ.get("SGLANG_TREE") or root / "build" / "sglang-v0.5.9")
    source = tree / "python" / "sglang" / "bench_serving.py"
    if not source.is_file():
        pytest.skip(f"no SGLang tree with bench_serving.py at {tree} (make apply, or set SGLANG_TREE)")
    module = ast.parse(source.read_text())
    wanted = [n for n in module.body if getattr(n, "name", None) in ("BenchmarkMetrics", "calculate_metrics")]
    names: dict[str, Any] = {"np": np, "warnings": warnings, "dataclass": dataclasses.dataclass, **vars(typing)}
    names |= {"PreTrainedTokenizerBase": object, "RequestFuncOutput": object, "DatasetRow": object}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(source), "exec"), names)
    return names["calculate_metrics"]


def test_our_metrics_equal_sglang_bench_servings_on_the_same_outputs() -> None:
    from types import SimpleNamespace

    calculate_metrics = _sglang_calculate_metrics()
    rng = np.random.default_rng(0)
    outputs = []
    for i in range(40):
        n = int(rng.integers(1, 30))
        itl = [float(x) for x in rng.uniform(0.005, 0.05, n - 1)]
        ttft = float(rng.uniform(0.05, 0.5))
        ok = i % 9 != 4
        outputs.append(StreamOutput(ok, ttft + sum(itl), ttft, itl, n if ok else 0, "" if ok else "HTTP 500", i * 0.1))
    theirs = [SimpleNamespace(**vars(o), generated_text="", text_chunks=[]) for o in outputs]
    tokenizer = SimpleNamespace(encode=lambda text, add_special_tokens=False: [])
    metrics, _ = calculate_metrics(None, theirs, 9.0, tokenizer, "sglang")
    ours = summarise(2.0, 1, outputs, 9.0)
    assert ours.completed == metrics.completed and ours.output_tokens == metrics.total_output
    assert ours.output_tok_per_s == pytest.approx(metrics.output_throughput, abs=0.01)
    assert ours.request_per_s == pytest.approx(metrics.request_throughput, abs=0.001)
    assert ours.concurrency == pytest.approx(metrics.concurrency, abs=0.01)
    for key, theirs_ms in [
        ("ttft_p50_ms", metrics.median_ttft_ms),
        ("ttft_p99_ms", metrics.p99_ttft_ms),
        ("tpot_p50_ms", metrics.median_tpot_ms),
        ("tpot_p99_ms", metrics.p99_tpot_ms),
        ("itl_p50_ms", metrics.median_itl_ms),
        ("itl_p99_ms", metrics.p99_itl_ms),
        ("e2e_p50_ms", metrics.median_e2e_latency_ms),
    ]:
        assert getattr(ours, key) == pytest.approx(theirs_ms, abs=0.001), key
