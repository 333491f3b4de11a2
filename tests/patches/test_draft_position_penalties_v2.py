"""Penalties on the v2 overlap worker (0013): counted from the tokens each step emitted, and applied
per draft position in verify, as plain decoding would have them.

Real overlap-scheduled batches: a prefill whose sampled tokens the worker leaves on its draft
input, the scheduler's decode preparation, its forward copy of the sampling info, the verify's
sample on a topk-1 chain, then filter, merge with a new prefill, and a fallback step. The
reference is SGLang's own plain-decode path: `cumulate_output_tokens` once per token, `apply`.
"""

from __future__ import annotations

import copy

import pytest
import torch
from launches import LaunchedOps
from verify_cpu import use_torch_verify, verify_input, word_tokenizer

from sglang_cpu import VOCAB, make_req, prefilled_decode_batch
from switch_helpers import NUM_DRAFT_TOKENS, v2_env

SAMPLING = [
    {"frequency_penalty": 0.7},
    {"presence_penalty": 0.9},
    {"frequency_penalty": 0.3, "presence_penalty": 0.5, "min_new_tokens": 4},
    {},  # no penalty, in the same batch
]
FIRST = [30, 31, 30, 33]  # the prefill's sampled tokens
DRAFT = [60, 61, 60]  # the chain after the root, one token repeated


@pytest.fixture
def env(tmp_path, monkeypatch):
    env = v2_env(tmp_path, monkeypatch)
    use_torch_verify(monkeypatch)
    env.tokenizer = word_tokenizer(tmp_path / "tokenizer")
    return env


def _reqs(env, prefix, sampling):
    reqs = [make_req(f"{prefix}{i}", 5 + i, sampling={"temperature": 0.0, **s}) for i, s in enumerate(sampling)]
    for req in reqs:
        req.tokenizer = env.tokenizer
    return reqs


def _plain_penalties(reqs, emitted, env):
    """[bs, V] what plain decoding adds to the logits after each request emitted its tokens."""
    batch = prefilled_decode_batch(env, reqs, [row[0] for row in emitted], topk=1, decode=False)
    orch = batch.sampling_info.penalizer_orchestrator
    width = max(len(row) for row in emitted)
    for j in range(width):
        # One plain step for the requests with a j-th token; the others' rows are put back.
        before = copy.deepcopy(orch)
        orch.cumulate_output_tokens(torch.tensor([row[j] if j < len(row) else 0 for row in emitted]))
        for b, row in enumerate(emitted):
            if j >= len(row):
                _restore_row(orch, before, b)
    penalties = torch.zeros(len(reqs), VOCAB)
    orch.apply(penalties)
    return penalties


def _restore_row(orch, before, b):
    for penalizer, old in zip(orch.penalizers.values(), before.penalizers.values(), strict=True):
        for name in ("cumulated_frequency_penalties", "cumulated_presence_penalties", "len_output_tokens"):
            if hasattr(penalizer, name):
                getattr(penalizer, name)[b] = getattr(old, name)[b]


def _counted(batch):
    penalties = torch.zeros(batch.batch_size(), VOCAB)
    batch.sampling_info.penalizer_orchestrator.apply(penalties)
    return penalties


def _verify(batch, draft_rows):
    """The verify's sample on the forward copy: (raw logits, as penalised, predict, accept_index, batch)."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    mwb = batch.get_model_worker_batch()
    mwb.sampling_info = mwb.sampling_info.copy_for_forward()
    draft = torch.tensor(draft_rows, dtype=torch.int64)
    chain = verify_input(draft, batch.seq_lens)
    # Each row's argmax is the next token of DRAFT: a plain decode would emit DRAFT, then 70.
    logits = torch.rand(draft.numel(), VOCAB, generator=torch.Generator().manual_seed(3))
    nxt = torch.tensor(DRAFT + [70]).repeat(len(draft))
    logits[torch.arange(len(nxt)), nxt] += 5.0
    raw = logits.clone()
    predict, _, accept_index = chain.sample(mwb, LogitsProcessorOutput(next_token_logits=logits))
    return raw, logits, predict, accept_index, mwb


def test_verify_penalises_each_position_after_the_prefill_is_counted(env):
    reqs = _reqs(env, "r", SAMPLING)
    batch = prefilled_decode_batch(env, reqs, FIRST, overlap=True, topk=1, carry_emitted=True)
    # The scheduler's decode preparation counted the prefill's tokens, as a plain server would.
    torch.testing.assert_close(_counted(batch), _plain_penalties(_reqs(env, "p", SAMPLING), [[t] for t in FIRST], env))

    # The chain's root is the pending token, the prefill's: counted already.
    raw, logits, *_ = _verify(batch, [[first] + DRAFT for first in FIRST])

    for i in range(NUM_DRAFT_TOKENS):
        # Row i predicts the token after draft position i: the plain output so far is the
        # prefill's token (the root), then the chain's first i tokens.
        emitted = [[FIRST[b]] + DRAFT[:i] for b in range(len(reqs))]
        plain = _plain_penalties(_reqs(env, "p", SAMPLING), emitted, env)
        rows = torch.arange(len(reqs)) * NUM_DRAFT_TOKENS + i
        torch.testing.assert_close(logits[rows], raw[rows] + plain)
    # min_new_tokens holds the EOS down until the output is long enough (request 2: 4 tokens).
    assert logits[2 * NUM_DRAFT_TOKENS + 2, 2] == float("-inf")
    assert logits[2 * NUM_DRAFT_TOKENS + 3, 2] > float("-inf")


def test_emitted_tokens_are_counted_once_through_filter_merge_and_fallback(env):
    from sglang.srt.managers.overlap_utils import FutureIndices
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.spec_penalties_v2 import accepted_token_ids, carry_emitted_tokens
    from sglang.srt.speculative.spec_switch_v2 import finish_plain_decode_v2, prepare_plain_decode_v2

    reqs = _reqs(env, "r", SAMPLING)
    batch = prefilled_decode_batch(env, reqs, FIRST, overlap=True, topk=1, carry_emitted=True)
    batch.spec_info.future_indices = FutureIndices(indices=torch.arange(len(reqs)))
    # Request 1's chain is rejected at its first token: it emits the bonus only.
    drafts = [[first] + DRAFT for first in FIRST]
    drafts[1] = [FIRST[1], 90, 91, 92]
    _, _, predict, accept_index, mwb = _verify(batch, drafts)
    accepted = accepted_token_ids(predict, accept_index)
    emitted = [[FIRST[b]] + [t for t in accepted[b].tolist() if t >= 0] for b in range(len(reqs))]
    assert len(emitted[0]) > len(emitted[1]) + 1, "the test needs accept lengths that differ"

    # What the overlap scheduler does with the step's result.
    next_input = EagleDraftInput(new_seq_lens=batch.seq_lens + 1)
    carry_emitted_tokens(next_input, accepted, mwb.sampling_info)
    next_input.future_indices = FutureIndices(indices=torch.arange(len(reqs)))
    batch.spec_info = next_input
    batch.filter_batch(keep_indices=[0, 1, 2])  # request 3 finished
    new_reqs = _reqs(env, "n", SAMPLING[:1])
    new = prefilled_decode_batch(env, new_reqs, [44], overlap=True, topk=1, carry_emitted=True, decode=False)
    new.spec_info.future_indices = FutureIndices(indices=torch.arange(4, 5))
    batch.merge_batch(new)
    batch.prepare_for_decode()

    kept = emitted[:3] + [[44]]
    plain = _plain_penalties(_reqs(env, "p", SAMPLING[:3] + SAMPLING[:1]), kept, env)
    torch.testing.assert_close(_counted(batch), plain)
    assert batch.spec_info.accepted_ids is None  # counted once

    # A fallback step (speculation switched off) emits one token per request.
    mwb = batch.get_model_worker_batch()
    mwb.sampling_info = mwb.sampling_info.copy_for_forward()
    # What the FutureMap resolves: each request's pending token, its last emitted one.
    mwb.spec_info.verified_id = torch.tensor([row[-1] for row in kept], dtype=torch.int32)
    entry = prepare_plain_decode_v2(mwb, batch.req_to_token_pool.req_to_token)
    sampled = [50, 50, 51, 52]
    result = GenerationBatchResult(next_token_ids=torch.tensor(sampled, dtype=torch.int64))
    finish_plain_decode_v2(result, entry, NUM_DRAFT_TOKENS)
    carry_emitted_tokens(result.next_draft_input, result.next_draft_input.verified_id.unsqueeze(1), mwb.sampling_info)
    result.next_draft_input.future_indices = FutureIndices(indices=torch.arange(4))
    batch.spec_info = result.next_draft_input
    batch.prepare_for_decode()

    kept = [row + [token] for row, token in zip(kept, sampled, strict=True)]
    plain = _plain_penalties(_reqs(env, "p", SAMPLING[:3] + SAMPLING[:1]), kept, env)
    torch.testing.assert_close(_counted(batch), plain)


@pytest.mark.parametrize("penalised", [True, False], ids=["penalties", "none"])
def test_a_verify_builds_the_emitted_ids_only_when_something_penalises(env, penalised):
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.spec_penalties_v2 import accepted_token_ids, carry_accepted_tokens

    sampling = SAMPLING if penalised else [{}] * len(SAMPLING)
    batch = prefilled_decode_batch(env, _reqs(env, "r", sampling), FIRST, overlap=True, topk=1, carry_emitted=True)
    _, _, predict, accept_index, mwb = _verify(batch, [[first] + DRAFT for first in FIRST])
    next_input = EagleDraftInput(new_seq_lens=batch.seq_lens + 1)
    with LaunchedOps() as launched:
        carry_accepted_tokens(next_input, predict, accept_index, mwb.sampling_info)

    if penalised:
        torch.testing.assert_close(next_input.accepted_ids, accepted_token_ids(predict, accept_index))
    else:
        # Every step of an unpenalised batch would pay these launches for nothing.
        assert launched.ops == []
        assert next_input.accepted_ids is None
