"""How the acceptance-after-re-enable tests read a server log (CPU, runs in CI)."""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest

import reenable as R

# Trimmed server logs of GPU runs (data/reenable/README.md).
DATA = Path(__file__).parent / "data" / "reenable"


def _decode(bs: int, accept_len: float) -> str:
    # 0.5.15's decode line on a speculative server (metrics_reporter.py)
    return (
        f"[2026-12-01 10:00:00] Decode batch, #running-req: {bs}, #token: 900, token usage: 0.01, "
        f"accept len: {accept_len:.2f}, accept rate: 0.50, cuda graph: True, gen throughput (token/s): 1.00"
    )


def _load(bs_steps: int) -> list[str]:
    # The load's prefill, then its steps with the burst in the batch.
    prefill = "[2026-12-01 10:00:00] Prefill batch, #new-seq: 28, #new-token: 1400, #cached-token: 0"
    return [prefill] + [_decode(R.BURST + R.SURVIVORS, 1.0)] * bs_steps


def test_the_verify_steps_after_the_burst_give_both_windows_and_the_tokens_before() -> None:
    verifies = [_decode(R.SURVIVORS, 3.0)] * R.EARLY_STEPS + [_decode(R.SURVIVORS, 2.0)] * 2 + [_decode(2, 4.0)]
    seen = R.after_burst("\n".join(_load(5) + verifies), Path("synthetic.log"))
    n = R.SURVIVORS
    assert seen.steps == R.EARLY_STEPS + 3
    assert seen.acceptance.early == pytest.approx(2.0)
    assert seen.acceptance.tail == pytest.approx(
        (R.EARLY_STEPS * 2.0 * n + 2 * 1.0 * n + 3.0 * 2) / ((R.EARLY_STEPS + 2) * n + 2)
    )
    assert seen.before == 1 + 5, "the prefill's token, then one a step while off"


def test_a_catch_up_step_is_not_a_verify() -> None:
    catch_up = "[2026-12-01 10:00:00] Adaptive spec: draft caught up over 20 positions of 4 requests"
    verifies = [_decode(R.SURVIVORS, 1.0)] + [_decode(R.SURVIVORS, 3.0)] * R.EARLY_STEPS
    seen = R.after_burst("\n".join(_load(5) + [catch_up] + verifies), Path("synthetic.log"))
    assert seen.acceptance.early == pytest.approx(2.0) and seen.steps == R.EARLY_STEPS
    assert seen.before == 1 + 5 + 1, "the catch-up's token comes before the first verify"


def test_a_log_without_the_burst_or_the_steps_after_it_is_refused() -> None:
    with pytest.raises(AssertionError, match="more than"):
        R.after_burst(_decode(R.SURVIVORS, 3.0), Path("x.log"))
    with pytest.raises(AssertionError, match="fewer than"):
        R.after_burst("\n".join(_load(2) + [_decode(R.SURVIVORS, 3.0)]), Path("x.log"))


def _log(run: str, name: str) -> tuple[str, Path]:
    path = DATA / run / f"reenable-{name}.log.xz"
    return lzma.decompress(path.read_bytes()).decode(), path


def _after(run: str, name: str) -> R.AfterBurst:
    return R.after_burst(*_log(run, name))


def _reference_early(run: str, name: str) -> float:
    return R.first_verifies_after_prefill(*_log(run, f"{name}-always-spec"))


@pytest.mark.parametrize("run", ["gpu22-v0.5.15-used-pool", "gpu21-v0.5.15-fresh-pool"])
def test_a_stale_draft_shows_in_the_first_verify_steps(run: str) -> None:
    skip = _after(run, "adaptive-skip")
    assert skip.acceptance.early < R.ACCEPT_FLOOR * _reference_early(run, "adaptive-skip")
    if run.startswith("gpu21"):
        plain = _after(run, "adaptive-plain")
        assert plain.acceptance.early >= R.ACCEPT_FLOOR * _reference_early(run, "adaptive-plain")
        return
    kept = _after(run, "adaptive-kept")
    # kept and skip decoded the same tokens, so one reference serves both
    assert kept.before == skip.before
    assert kept.acceptance.early >= R.ACCEPT_FLOOR * _reference_early(run, "adaptive-skip")
    assert skip.acceptance.tail >= R.ACCEPT_FLOOR * kept.acceptance.tail, "the tail told them apart after all"


def test_the_first_verify_step_is_where_the_requests_counters_put_it() -> None:
    # 384 and 386: the tokens before speculation came back by each survivor's own counters, in the
    # same run (spec_verify_ct and the accepted drafts in meta_info, test_acceptance_gpu.py)
    run = "gpu22-v0.5.9-used-pool"
    assert (_after(run, "v1").before, _after(run, "v2").before) == (384, 386)
    run = "gpu22-v0.5.15-used-pool"
    assert _after(run, "adaptive-plain").before == _after(run, "adaptive-kept").before + 1, "the catch-up's token"


def test_the_v0_5_9_catch_up_step_logs_no_accept_length() -> None:
    text, path = _log("gpu22-v0.5.9-used-pool", "v2")
    seen = R.after_burst(text, path)
    assert seen.acceptance.early >= R.ACCEPT_FLOOR * _reference_early("gpu22-v0.5.9-used-pool", "v2")
    with pytest.raises(AssertionError, match="no accept length"):
        R.after_burst(text.replace(R.CATCH_UP_LOG, "draft up to date"), path)


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


def test_the_reference_starts_at_the_first_verify_and_is_served_once_per_load(monkeypatch, tmp_path) -> None:
    text, _ = _log("gpu22-v0.5.15-used-pool", "adaptive-skip-always-spec")
    ref_log = tmp_path / "ref.log"
    ref_log.write_text(text)
    served: list[tuple[list[list[int]], list[int]]] = []

    def serve(name, spec, ctx, ids, max_new, used_pool=False):  # stands in for the GPU server only
        served.append((ids, max_new))
        meta = {"spec_verify_ct": 10, "spec_num_correct_drafts": 15}  # 0.5.15's names
        return [{"meta_info": meta} for _ in ids], ref_log

    monkeypatch.setattr(R, "serve", serve)
    ctx: dict = {}
    spec = R.ServerSpec("target")
    survivors = [([1, 2], list(range(100, 110)), 4), ([3], list(range(200, 210)), 4)]
    got = R.reference(ctx, "ref", spec, survivors)
    # the prefill decodes the last token before the first verify step: 103 and 203
    assert served == [([[1, 2, 100, 101, 102], [3, 200, 201, 202]], [7, 7])]
    assert got == R.Acceptance(R.first_verifies_after_prefill(text, ref_log), 1.5)
    assert R.reference(ctx, "ref-again", spec, survivors) == got and len(served) == 1
    R.reference(ctx, "ref-later", spec, [(ids, out, 5) for ids, out, _ in survivors])
    assert len(served) == 2, "another load is served anew"
