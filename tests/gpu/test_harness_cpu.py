"""The GPU suite's verdicts on CPU (runs in CI): how a divergence from the no-speculation server is
classified, and when a switch's off-tie divergences exceed a control run's by more than chance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.run.client import Result

import gpu_harness as H
import greedy_compare as G
import staggered as S


def _run(results: list[Result]) -> H.Run:
    return H.Run("synthetic", results, "", Path("synthetic.log"), None)


def _ref(prompt: str, ids: list[int], tops: list[list[tuple[float, int, Any]]]) -> Result:
    # SGLang's meta_info["output_top_logprobs"]: per output position, (logprob, token id, text)
    return Result(prompt, output_ids=ids, meta={"output_top_logprobs": tops})


def test_a_divergence_is_a_near_tie_only_within_the_tolerance_and_the_top_five() -> None:
    top = [(-0.50, 7, None), (-0.55, 8, None), (-0.90, 9, None)]
    ref = _run(
        [
            _ref("a", [1, 7], [[(-0.1, 1, None)], top]),
            _ref("b", [1, 7], [[(-0.1, 1, None)], top]),
            _ref("c", [1, 7], [[(-0.1, 1, None)], top]),
            _ref("d", [1, 7], [[(-0.1, 1, None)], top]),
        ]
    )
    spec = _run(
        [
            Result("a", output_ids=[1, 7]),
            Result("b", output_ids=[1, 8]),
            Result("c", output_ids=[1, 9]),
            Result("d", output_ids=[1, 4]),
        ]
    )
    cmp = G.compare(spec, ref)
    assert (cmp.total, cmp.equal) == (4, 1)
    by_prompt = {d["prompt"]: d for d in cmp.divergences}
    assert by_prompt["b"]["near_tie"] and abs(by_prompt["b"]["gap"] - 0.05) < 1e-9 and by_prompt["b"]["pos"] == 1
    assert not by_prompt["c"]["near_tie"] and abs(by_prompt["c"]["gap"] - 0.40) < 1e-9  # beyond 0.1 nats
    assert not by_prompt["d"]["near_tie"] and by_prompt["d"]["gap"] is None  # outside the top five
    assert [d["prompt"] for d in cmp.not_near_tie] == ["c", "d"]


def test_failed_requests_are_left_out_of_the_comparison() -> None:
    ref = _run([_ref("a", [1], [[(-0.1, 1, None)]]), _ref("b", [1], [[(-0.1, 1, None)]])])
    spec = _run([Result("a", output_ids=[1]), Result("b", error="HTTP 500")])
    cmp = G.compare(spec, ref)
    assert (cmp.total, cmp.equal, cmp.skipped, cmp.divergences) == (1, 1, 1, [])


def test_within_chance_allows_noise_and_catches_a_jump() -> None:
    assert G.within_chance(224, 224) and G.within_chance(0, 0)
    assert G.within_chance(260, 224)  # 36 more, against 3 x sqrt(484) = 66
    assert not G.within_chance(450, 224)  # a switch that broke the draft or target state
    assert not G.within_chance(10, 0)  # 3 x sqrt(10) = 9.5
    assert G.within_chance(100, 224)  # fewer than the control is never a failure


def test_accepted_drafts_are_read_under_either_releases_name() -> None:
    # meta_info of a 0.5.9 and a 0.5.15 request: 8 verify steps that accepted 24 drafts
    assert H.accepted_drafts({"spec_verify_ct": 8, "spec_accept_token_num": 24}) == 24
    assert H.accepted_drafts({"spec_verify_ct": 8, "spec_num_correct_drafts": 24, "spec_accepted_drafts": 24}) == 24
    assert H.accepted_drafts({"completion_tokens": 32}) == 0  # no speculation


def test_a_fixture_sets_own_prompts_make_the_ramp_as_they_are() -> None:
    own = [f"def f{i}():\n" for i in range(sum(H.RAMP))]
    groups = H.ramp_prompts(base=own)
    assert [len(g) for g in groups] == H.RAMP and [p for g in groups for p in g] == own
    assert all(p.startswith("Request ") for g in H.ramp_prompts() for p in g), "the shared prompts are numbered"
    with pytest.raises(ValueError, match="distinct prompts"):
        H.ramp_prompts(base=own[:-1] + own[:1])


def test_float32_logits_only_for_the_generated_trained_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SGL_TEST_MODEL", raising=False)
    assert H.pair_flags("trained") == H.pair_flags("trained-gpu-bound") == ["--enable-fp32-lm-head"]
    assert H.pair_flags("exact") == H.pair_flags("kimi-random") == []
    monkeypatch.setenv("SGL_TEST_MODEL", "/models/user")
    assert H.pair_flags("trained") == []


def test_adaptive_state_switches_are_read_in_order_from_the_log() -> None:
    # as eagle_worker_v2.py (0.5.15) logs them, between other scheduler lines
    log = (
        "[2026-12-03 03:20:19] Prefill batch, #new-seq: 4\n"
        "[2026-12-03 03:20:20] Switch adaptive runtime state: steps 3 -> 0, draft_tokens 4 -> 1\n"
        "[2026-12-03 03:20:21] Decode batch, #running-req: 30\n"
        "[2026-12-03 03:20:22] Switch adaptive runtime state: steps 0 -> 3, draft_tokens 1 -> 4\n"
    )
    assert H.adaptive_state_switches(log) == ["steps 3 -> 0, draft_tokens 4 -> 1", "steps 0 -> 3, draft_tokens 1 -> 4"]
    assert H.adaptive_state_switches("Decode batch, #running-req: 30\n") == []


@pytest.mark.parametrize("on_at", [H.ENABLE, H.DISABLE], ids=["switch", "adaptive-tiers"])
def test_the_staggered_load_has_requests_behind_when_speculation_returns(on_at: int) -> None:
    """The catch-up tests' load starts above the off threshold and, when the batch has fallen to
    where speculation returns (the switch's M; the adaptive tiers' N, steps=0 above it), still
    runs requests whose draft is tens of positions behind."""
    assert S.REQUESTS > H.DISABLE
    behind = S.behind_when_back(on_at)
    assert len(behind) == on_at and min(behind) >= 24
    assert S.behind_when_back(2, requests=4) == [40, 40]
