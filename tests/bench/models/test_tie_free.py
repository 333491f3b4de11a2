"""The greedy margins that choose the trained set's prompts, against a step-by-step reference."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench_helpers import stepwise_greedy_margin  # noqa: E402

from bench.models.tie_free import greedy_margins, most_tie_free, served_copy  # noqa: E402


def _model() -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return LlamaForCausalLM(cfg).eval()


def test_batched_cached_margins_equal_one_prompt_recomputed_at_every_step() -> None:
    model = _model()
    rows = [[5, 9, 11], [3], [7, 7, 7, 7, 7, 2, 40], [60, 1], [12, 13, 14], [8, 1, 30], [2, 2, 9], [3, 4, 5, 6]]
    # Four prompts of one length in batches of three: each row's cache and margin stay its own.
    got = greedy_margins(model, rows, new_tokens=6, device="cpu", batch=3)
    want = [stepwise_greedy_margin(model, r, 6) for r in rows]
    assert got == pytest.approx(want, abs=1e-5)
    assert len(set(round(v, 6) for v in want)) == len(rows), "distinct prompts, distinct margins"


def test_the_served_copy_holds_the_weights_rounded_to_the_served_dtype() -> None:
    import torch

    model = _model()
    served = served_copy(model, "float16")
    for (name, p), q in zip(model.named_parameters(), served.parameters(), strict=True):
        assert q.dtype == torch.float32 and torch.equal(q, p.detach().half().float()), name
    assert not all(torch.equal(p, q) for p, q in zip(model.parameters(), served.parameters(), strict=True)), (
        "the original is kept"
    )


def test_the_prompts_furthest_from_a_tie_are_kept_in_their_order() -> None:
    prompts = ["a", "b", "c", "d", "e"]
    kept = most_tie_free(prompts, [0.5, 0.001, 2.0, 0.5, 0.0], 3)
    assert [p.text for p in kept] == ["a", "c", "d"] and [p.least_margin for p in kept] == [0.5, 2.0, 0.5]
    assert [p.text for p in most_tie_free(prompts, [1.0] * 5, 2)] == ["a", "b"], "ties keep the earlier prompts"
    with pytest.raises(ValueError, match="6 prompts asked of 5 candidates"):
        most_tie_free(prompts, [1.0] * 5, 6)
    with pytest.raises(ValueError, match="no empty prompt"):
        greedy_margins(_model(), [[1], []], 2, "cpu")
