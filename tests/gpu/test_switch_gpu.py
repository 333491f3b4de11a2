"""The speculation switch on a real GPU: ramp, counters, greedy equality, TP agreement, CUDA graphs.

Each (worker, pair) server runs once per session; its outputs, counters and log are shared by the
tests below. Summary lines (quotable) are printed in pytest's terminal summary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.results.logparse import captured_graph_sets

import gpu_harness as H
import greedy_compare as G
from gpu_harness import SUMMARY

pytestmark = [pytest.mark.gpu, pytest.mark.switch]


@pytest.fixture(scope="session")
def ctx(sgl_tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    return H.ramp_context(sgl_tree, log_dir, fixture_models)


ref_run, switch_run = H.ref_run, H.switch_run


CASES = [pytest.param(w, p, id=f"{w}-{p}") for w in ("v1", "v2") for p in ("exact", "random")]


@pytest.mark.parametrize("worker,pair", CASES)
def test_ramp_serves_without_error(ctx: dict[str, Any], worker: str, pair: str) -> None:
    run = switch_run(ctx, worker, pair)
    ramp = ",".join(map(str, H.RAMP))
    SUMMARY.append(
        f"[{worker} {pair}] ramp {ramp}: {len(run.results)} requests, {len(run.errors)} errors, "
        f"{H.NEW_TOKENS} new tokens each; log {run.log_path}"
    )
    assert not run.errors, f"{len(run.errors)} request(s) failed, first: {run.errors[0]}\nlog: {run.log_path}"
    short = [r for r in run.results if r.completion_tokens != H.NEW_TOKENS]
    assert not short, f"{len(short)} request(s) did not produce {H.NEW_TOKENS} tokens (ignore_eos is set)"


@pytest.mark.parametrize("worker,pair", CASES)
def test_both_kinds_of_step(ctx: dict[str, Any], worker: str, pair: str) -> None:
    run = switch_run(ctx, worker, pair)
    c = run.counters()
    src = "/metrics" if run.metrics is not None else "log"
    assert c is not None, f"no spec-switch counters in /metrics or the log ({run.log_path})"
    SUMMARY.append(
        f"[{worker} {pair}] counters ({src}): spec_steps={c.spec_steps} fallback_steps={c.fallback_steps} "
        f"switches={c.switches} (disable > {H.DISABLE}, enable <= {H.ENABLE})"
    )
    assert c.spec_steps > 0, "no speculative step ran"
    assert c.fallback_steps > 0, "no fallback (plain decode) step ran"
    assert c.switches >= 2, "the ramp goes up and down: expected at least one switch each way"


TRAINED_CASES = [pytest.param(w, "trained", id=f"{w}-trained") for w in ("v1", "v2")]
# The trained pair's ramp is held-out code, text like what its target learned, and its logits are
# float32 (H.pair_flags): a divergence should be rare (English prompts and float16 logits: 5 of 479
# flipped, at exact logit ties), and each must still be a near-tie. With float32 logits 4-5 of 479
# code prompts still flipped, 5e-5 to 4e-4 nats from a tie, so the set keeps the prompts whose
# greedy path is furthest from one (bench.models.tie_free).
TRAINED_FLOOR = 0.99


@pytest.mark.parametrize("worker,pair", CASES + TRAINED_CASES)
def test_greedy_matches_nospec(ctx: dict[str, Any], worker: str, pair: str) -> None:
    ref = ref_run(ctx, pair)
    assert not ref.errors, f"reference server failed: {ref.errors[0]}"
    run = switch_run(ctx, worker, pair)
    cmp = G.compare(run, ref)
    SUMMARY.append(f"[{worker} {pair}] {cmp.line()}")
    for d in cmp.divergences[:5]:
        SUMMARY.append(
            f"[{worker} {pair}]   first divergence at output pos {d['pos']}: spec {d['spec']} vs "
            f"no-spec {d['ref']}, chosen token {d['gap']} nats below the target's best, near-tie={d['near_tie']} ({d['prompt']!r})"
        )
    if pair == "trained":
        assert cmp.rate >= TRAINED_FLOOR, f"only {cmp.equal}/{cmp.total} outputs equal no-spec greedy ones"
    bad = cmp.not_near_tie
    assert not bad, (
        f"{len(bad)} request(s) diverge from no-spec greedy output where the target is not near a tie "
        f"(chosen token more than {G.TIE_TOL} nats below the target's best, or not in its top-5): first {bad[0]}"
    )


@pytest.mark.parametrize("worker", ["v1", "v2"])
def test_fallback_replays_cuda_graphs(ctx: dict[str, Any], worker: str) -> None:
    run = switch_run(ctx, worker, "exact")
    lines = H.fallback_decode_lines(run, H.DISABLE)
    in_range, eager = H.fallback_graph_replays(run)
    SUMMARY.append(
        f"[{worker} exact] fallback decode log lines: {len(lines)}, of them with bs <= {H.CUDA_GRAPH_MAX_BS}: "
        f"{len(in_range)}, cuda graph True: {len(in_range) - len(eager)}"
    )
    assert in_range, f"no decode log line written in fallback with bs <= {H.CUDA_GRAPH_MAX_BS} ({run.log_path})"
    assert not eager, f"{len(eager)} fallback decode batch(es) ran without a CUDA graph, first: {eager[0].line}"


@pytest.mark.parametrize("worker", ["v1", "v2"])
def test_graph_sets_cover_only_their_batch_sizes(ctx: dict[str, Any], worker: str) -> None:
    """Verify graphs stop at the size a batch of DISABLE pads to; DECODE graphs start above ENABLE."""
    run = switch_run(ctx, worker, "exact")
    sets = captured_graph_sets(run.log_text)
    ref = captured_graph_sets(ref_run(ctx, "exact").log_text)
    SUMMARY.append(
        f"[{worker} exact] graph sets (bs, capture s, GB): "
        + "; ".join(
            f"{g.kind} bs {g.sizes[0]}..{g.sizes[-1]} ({len(g.sizes)}) {g.seconds} s {g.gigabytes} GB" for g in sets
        )
        + " | no-spec server: "
        + "; ".join(f"{g.kind} bs {g.sizes[0]}..{g.sizes[-1]} {g.seconds} s {g.gigabytes} GB" for g in ref)
    )
    assert [g.kind for g in sets] == ["target", "plain-decode"], f"unexpected capture lines in {run.log_path}: {sets}"
    verify, decode = sets
    assert verify.sizes[-1] >= H.DISABLE and [b for b in verify.sizes if b >= H.DISABLE] == [verify.sizes[-1]], (
        f"verify graphs {verify.sizes} should stop at the first size >= {H.DISABLE}"
    )
    assert decode.sizes[0] > H.ENABLE, f"plain-decode graphs {decode.sizes} should start above {H.ENABLE}"


SPECULATIVE_REQUEST_CAP = 48  # SGLang 0.5.9's max_running_requests for EAGLE servers left unset


def test_switch_server_batches_beyond_the_speculative_cap(ctx: dict[str, Any]) -> None:
    """Without --max-running-requests a speculative server runs at most 48 requests; with the switch
    the cap is the CUDA graph limit (64 here), so its fallback batches like a plain server (0003)."""
    models = H.models_for("exact", ctx["fx"])
    spec = H.switch_spec(models, "v1", H.tp_size(), max_running_requests=None)
    concurrency = 2 * SPECULATIVE_REQUEST_CAP
    prompts = [p for g in ctx["groups"] for p in g][:concurrency]
    run = H.once(
        "v1-exact-uncapped",
        lambda: H.run_server("switch-v1-exact-uncapped", spec, ctx["tree"], ctx["logs"], [prompts], H.GREEDY),
    )
    assert not run.errors, f"{len(run.errors)} request(s) failed, first: {run.errors[0]}\nlog: {run.log_path}"
    rl = H.parse_log(run.log_text).get(0)
    largest = max((d.batch_size for d in rl.decode), default=0) if rl else 0
    SUMMARY.append(
        f"[v1 exact uncapped] {len(run.results)} requests at concurrency {concurrency}, no "
        f"--max-running-requests: largest decode batch {largest}"
    )
    assert largest > SPECULATIVE_REQUEST_CAP, (
        f"the largest decode batch was {largest}: the speculative cap of {SPECULATIVE_REQUEST_CAP} still applies "
        f"({run.log_path})"
    )


@pytest.mark.gpus(2)
def test_tp2_ranks_agree(ctx: dict[str, Any]) -> None:
    models = H.models_for("exact", ctx["fx"])
    spec = H.switch_spec(models, "v1", 2, extra=["--enable-metrics-for-all-schedulers"])
    run = H.once(
        "v1-exact-tp2",
        lambda: H.run_server("switch-v1-exact-tp2", spec, ctx["tree"], ctx["logs"], ctx["groups"], H.GREEDY),
    )
    assert not run.errors, f"{len(run.errors)} request(s) failed at --tp 2, first: {run.errors[0]}"
    ranks = H.parse_log(run.log_text)
    events = {r: rl.events for r, rl in ranks.items() if rl.events or rl.counters}
    counters = {r: (rl.counters.as_dict() if rl.counters else None) for r, rl in ranks.items()}
    SUMMARY.append(
        f"[v1 exact tp2] ranks seen: {sorted(ranks)}; switch events per rank: "
        + "; ".join(
            f"TP{r}: {len(e)} ({', '.join(f'{d}@{bs}' for d, bs in e[:6])}{'...' if len(e) > 6 else ''})"
            for r, e in sorted(events.items())
        )
        + f"; counters {counters}"
    )
    assert {0, 1} <= set(events), (
        f"expected spec-switch lines from TP0 and TP1, got ranks {sorted(events)} "
        f"({run.log_path}); the patch must log its switch events on every rank"
    )
    assert events[0], "TP0 logged no switch"
    assert events[0] == events[1], f"ranks took different decisions: TP0 {events[0][:10]} vs TP1 {events[1][:10]}"
    first, second = counters.get(0), counters.get(1)
    if first and second:
        # the last state line of each rank may be written at slightly different steps; switches must agree
        assert first["switches"] == second["switches"]
