"""The switch on two GPUs with the Kimi-K2.5-shaped fixture (MLA and MoE layers; bench/kimi_fixture.py):
under DP attention as Kimi is served at scale (`--tp 2 --dp 2 --enable-dp-attention`, 0015), and at
`--tp 2` without it. Both with the v1 worker: under DP attention the v2 worker and `auto` are refused
at start-up (0015's header says why).

Each DP rank schedules its own requests, and the switch decides from the largest decode batch the
ranks gather every step, so both ranks must log the same switch events at the same (gathered)
batch sizes, run both kinds of step and serve every request; a rank that disagreed would hang or
crash the MoE layers' collectives. Greedy outputs are held to a no-speculation server at the same
layout, as test_kimi_gpu does at TP 1. Skipped with the reason below two GPUs; on a two-GPU machine
(device kind nvidia-h200-x2), one call each to fit a device call's 10 minutes:
`bash ci/gpu/run-on-device.sh test -k dp_attention`, then `... test -k kimi_tp2`.
"""

from __future__ import annotations

from typing import Any

import pytest

import gpu_harness as H
import greedy_compare as G
from gpu_harness import SUMMARY

pytestmark = [pytest.mark.gpu, pytest.mark.switch, pytest.mark.gpus(2)]

PAIR = "kimi-exact"
DP_ATTENTION = ["--dp", "2", "--enable-dp-attention"]
# Every scheduler writes its decode lines, so each DP rank's counters are in the log.
ALL_SCHEDULERS = ["--enable-metrics-for-all-schedulers"]


@pytest.fixture(scope="module")
def ctx(sgl_tree: Any, log_dir: Any, fixture_models: Any) -> dict[str, Any]:
    return H.ramp_context(sgl_tree, log_dir, fixture_models)


def _switch_run(ctx: dict[str, Any], name: str, extra: list[str]) -> H.Run:
    spec = H.switch_spec(H.models_for(PAIR, ctx["fx"]), "v1", 2, extra=extra + ALL_SCHEDULERS)
    groups = H.groups_for(ctx, PAIR)
    return H.once(name, lambda: H.run_server(name, spec, ctx["tree"], ctx["logs"], groups, H.GREEDY))


def _ranks_agree(run: H.Run, label: str) -> None:
    """Both ranks logged the same switch events and ran both kinds of step."""
    assert not run.errors, f"{len(run.errors)} request(s) failed, first: {run.errors[0]}\nlog: {run.log_path}"
    ranks = H.parse_log(run.log_text)
    events = {r: rl.events for r, rl in ranks.items() if rl.events}
    counters = {r: (rl.counters.as_dict() if rl.counters else None) for r, rl in ranks.items()}
    SUMMARY.append(f"[{label}] switch events per rank: {events}; counters {counters}")
    assert {0, 1} <= set(events), f"expected switch events from TP0 and TP1, got {sorted(events)} ({run.log_path})"
    assert events[0] == events[1], f"ranks decided differently: {events[0][:10]} vs {events[1][:10]}"
    c = run.counters()
    assert c is not None and c.spec_steps > 0 and c.fallback_steps > 0, f"counters {c} ({run.log_path})"


def test_dp_attention_ranks_agree(ctx: dict[str, Any]) -> None:
    _ranks_agree(_switch_run(ctx, f"switch-v1-{PAIR}-tp2-dp2", DP_ATTENTION), "kimi v1 tp2 dp2")


def test_dp_attention_greedy_matches_nospec(ctx: dict[str, Any]) -> None:
    run = _switch_run(ctx, f"switch-v1-{PAIR}-tp2-dp2", DP_ATTENTION)
    prompts = [p for g in H.groups_for(ctx, PAIR) for p in g]
    models = H.models_for(PAIR, ctx["fx"])
    ref = H.once(
        f"ref-{PAIR}-tp2-dp2",
        lambda: H.reference(f"nospec-{PAIR}-tp2-dp2", models, ctx["tree"], ctx["logs"], prompts, 2, DP_ATTENTION),
    )
    assert not ref.errors, f"reference server failed: {ref.errors[0]}"
    cmp = G.compare(run, ref)
    SUMMARY.append(f"[kimi v1 tp2 dp2 exact] {cmp.line()}")
    assert not cmp.not_near_tie, f"divergences where the target is not near a tie: {cmp.not_near_tie[:3]}"


def test_kimi_tp2_ranks_agree(ctx: dict[str, Any]) -> None:
    _ranks_agree(_switch_run(ctx, f"switch-v1-{PAIR}-tp2", []), "kimi v1 tp2")
