"""How the acceptance-after-re-enable tests read a server log (CPU, runs in CI)."""

from __future__ import annotations

from pathlib import Path

import pytest

import reenable as R


def _decode(bs: int, accept_len: float) -> str:
    # 0.5.15's decode line on a speculative server (metrics_reporter.py)
    return (
        f"[2026-12-01 10:00:00] Decode batch, #running-req: {bs}, #token: 900, token usage: 0.01, "
        f"accept len: {accept_len:.2f}, accept rate: 0.50, cuda graph: True, gen throughput (token/s): 1.00"
    )


def test_the_steps_after_the_burst_give_the_accept_length_and_the_tokens_before() -> None:
    burst = R.BURST + R.SURVIVORS
    lines = [_decode(burst, 1.0)] * 3 + [_decode(R.SURVIVORS, 1.0)] + [_decode(R.SURVIVORS, 3.0)] * 4
    lines += ["[2026-12-01 10:00:01] Prefill batch, #new-seq: 1"] + [_decode(2, 2.0)]
    seen = R.after_burst("\n".join(lines), Path("synthetic.log"))
    n = R.SURVIVORS
    assert seen.steps == 5, "the first line after the burst is left out"
    assert seen.accept_len == pytest.approx((4 * 3.0 * n + 2.0 * 2) / (4 * n + 2))
    assert seen.before == R.LONG - round((1.0 * n + 4 * 3.0 * n + 2.0 * 2) / n)


def test_a_log_without_the_burst_or_the_steps_after_it_is_refused() -> None:
    with pytest.raises(AssertionError, match="more than"):
        R.after_burst(_decode(R.SURVIVORS, 3.0), Path("x.log"))
    with pytest.raises(AssertionError, match="after the burst"):
        R.after_burst("\n".join([_decode(R.BURST, 1.0), _decode(R.SURVIVORS, 3.0)]), Path("x.log"))


def test_the_fill_takes_the_pool_without_sharing_a_prefix() -> None:
    fill = R.fill_ids(4096)
    assert sum(len(ids) for ids in fill) >= 0.95 * R.POOL_TOKENS, "never-used slots would be left for the load"
    assert len({tuple(ids[:16]) for ids in fill}) == len(fill), "two fill prompts share a prefix"
    assert all(0 <= t < 4096 for ids in fill for t in ids)
    assert R.fill_ids(4096) == fill, "the fill changes between the cases' servers"
    assert R.used_pool_flags() == ["--max-total-tokens", str(R.POOL_TOKENS)]


def test_the_pool_size_is_read_from_the_start_up_line() -> None:
    # 0.5.15's scheduler start-up line
    line = "[2026-12-07 14:42:09] max_total_num_tokens=20000, chunked_prefill_size=8192, max_prefill_tokens=16384"
    assert R.pool_tokens(line, Path("x.log")) == 20_000
    with pytest.raises(AssertionError, match="max_total_num_tokens"):
        R.pool_tokens("KV Cache is allocated.", Path("x.log"))
