"""The v2 (overlap) EAGLE worker's fallback step: batch, FutureMap and one-step-late processing.

Real SGLang objects on CPU; the target's sampled tokens are inputs the test chooses.
"""

from __future__ import annotations

import types

import pytest
import torch

from sglang_cpu import (
    HIDDEN,
)
from switch_helpers import NUM_DRAFT_TOKENS, NUM_REQS, scheduler_for_output_processing, v2_decode_batch, v2_env


@pytest.fixture
def env(tmp_path, monkeypatch):
    return v2_env(tmp_path, monkeypatch)


def _fallback(batch, sampled):
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.speculative.spec_switch_v2 import (
        finish_plain_decode_v2,
        prepare_plain_decode_v2,
    )

    mwb = batch.get_model_worker_batch()
    req_to_token = batch.req_to_token_pool.req_to_token
    entry = prepare_plain_decode_v2(mwb, req_to_token)
    result = GenerationBatchResult(next_token_ids=torch.tensor(sampled, dtype=torch.int64))
    finish_plain_decode_v2(result, entry, NUM_DRAFT_TOKENS)
    return mwb, entry, result


def test_fallback_is_a_plain_decode_on_the_reserved_slots(env):
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

    batch, reqs = v2_decode_batch(env)
    s = batch.seq_lens.clone()
    allocated = [r.kv_allocated_len for r in reqs]
    free = batch.token_to_kv_pool_allocator.available_size()
    pending = batch.spec_info.verified_id.tolist()

    mwb, entry, _ = _fallback(batch, [200 + i for i in range(NUM_REQS)])

    assert mwb.forward_mode == ForwardMode.DECODE and mwb.spec_info is None
    assert mwb.capture_hidden_mode == CaptureHiddenMode.FULL
    assert mwb.input_ids.tolist() == pending and mwb.input_ids.dtype == torch.int64
    assert mwb.out_cache_loc.shape == (NUM_REQS,)
    rows = batch.req_to_token_pool.req_to_token[batch.req_pool_indices, s.long()]
    assert mwb.out_cache_loc.tolist() == rows.tolist()
    assert torch.equal(mwb.seq_lens, s + 1)
    assert torch.equal(mwb.seq_lens_cpu, s + 1)
    assert mwb.seq_lens_sum == int(s.sum()) + NUM_REQS
    # prepare_for_decode reserved the slots; the worker takes one and allocates nothing.
    assert [r.kv_allocated_len for r in reqs] == allocated
    assert batch.token_to_kv_pool_allocator.available_size() == free
    # The scheduler's own tensors are untouched (overlap: it still holds them).
    assert torch.equal(batch.seq_lens, s) and torch.equal(entry.seq_lens, s)


def test_fallback_result_has_the_verify_layout(env):
    batch, _ = v2_decode_batch(env)
    s = batch.seq_lens.clone()
    sampled = [200 + i for i in range(NUM_REQS)]
    _, _, result = _fallback(batch, sampled)

    assert result.spec_skipped
    assert result.next_token_ids.shape == (NUM_REQS * NUM_DRAFT_TOKENS,)
    assert result.next_token_ids[::NUM_DRAFT_TOKENS].tolist() == sampled
    assert result.accept_lens.tolist() == [1] * NUM_REQS
    assert result.accept_lens.dtype == torch.int32
    draft_input = result.next_draft_input
    assert draft_input.verified_id.tolist() == sampled
    assert draft_input.verified_id.dtype == torch.int32
    assert torch.equal(draft_input.new_seq_lens, s + 1)
    assert draft_input.new_seq_lens.dtype == s.dtype
    assert draft_input.verify_done is not None


def test_next_lengths_are_published_before_the_target_forward(env):
    """The scheduler may prepare the next batch while the fallback's forward runs.

    It blocks on verify_done before it reads new_seq_lens (maybe_wait_verify_done). A verify can
    only signal after sampling; a plain decode's lengths are s + 1 whatever it samples, so
    prepare_plain_decode_v2 publishes them before the target is launched. Signalling after the
    forward made every fallback step wait for the GPU, as a server without overlap does.
    """
    batch, _ = v2_decode_batch(env)
    s = batch.seq_lens.clone()
    mwb = batch.get_model_worker_batch()
    from sglang.srt.speculative.spec_switch_v2 import prepare_plain_decode_v2

    entry = prepare_plain_decode_v2(mwb, batch.req_to_token_pool.req_to_token)

    published = entry.next_draft_input
    assert published.verify_done is not None and published.verify_done.query()
    assert torch.equal(published.new_seq_lens, s + 1)
    # The scheduler gets its own tensor, not the one the running forward reads.
    assert published.new_seq_lens.data_ptr() != mwb.seq_lens.data_ptr()
    # What the overlap loop does right after launching the step; nothing of the forward is needed.
    batch.spec_info = published
    batch.seq_lens = published.new_seq_lens
    batch.maybe_wait_verify_done()
    assert batch.seq_lens.tolist() == (s + 1).tolist()


def _assert_new_slots_avoid(req_to_token, reqs, allocated_before, *in_use):
    """The KV slots each request reserved past allocated_before are none of in_use's."""
    taken = set().union(*(set(t.flatten().tolist()) for t in in_use))
    for req, before in zip(reqs, allocated_before, strict=True):
        new_slots = req_to_token[req.req_pool_idx, before : req.kv_allocated_len]
        assert not set(new_slots.tolist()) & taken, (req.rid, new_slots.tolist())


def test_next_batch_prepared_while_a_fallback_runs_leaves_its_slots_alone(env):
    """Two fallback steps in the overlap loop's order, with the next batch prepared early.

    The loop prepares batch k+1 once batch k has published its lengths, then processes batch
    k-1's result. Everything that preparation writes must be disjoint from what step k still
    reads or writes on the GPU, its KV slot at position s, and from the verify window s..s+n-1
    that the step after a switch back writes.
    """
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.speculative.spec_switch_v2 import (
        finish_plain_decode_v2,
        prepare_plain_decode_v2,
    )

    batch, reqs = v2_decode_batch(env, n=3)
    req_to_token = batch.req_to_token_pool.req_to_token
    rows = batch.req_pool_indices
    scheduler = scheduler_for_output_processing()

    def launch():
        mwb = batch.get_model_worker_batch()
        entry = prepare_plain_decode_v2(mwb, req_to_token)
        # What the overlap loop does right after the launch; then it may prepare the next batch.
        batch.spec_info = entry.next_draft_input
        batch.seq_lens = entry.next_draft_input.new_seq_lens
        return mwb, entry

    def finish(entry, sampled):
        result = GenerationBatchResult(next_token_ids=torch.tensor(sampled, dtype=torch.int64))
        finish_plain_decode_v2(result, entry, NUM_DRAFT_TOKENS)
        _draft_input_like_draft_extend(result, len(sampled))
        return result

    mwb1, entry1 = launch()
    batch.prepare_for_decode()  # batch 2, while step 1 runs
    result1 = finish(entry1, [400, 401, 402])
    assert scheduler._resolve_spec_overlap_token_ids(result1, batch) == [[400], [401], [402]]

    mwb2, entry2 = launch()
    s2 = entry2.seq_lens.long()
    window = torch.stack([s2 + j for j in range(NUM_DRAFT_TOKENS)], dim=1)
    read_by_step2 = req_to_token[rows.unsqueeze(1), window].clone()
    allocated_before = [r.kv_allocated_len for r in reqs]
    batch.prepare_for_decode()  # batch 3, while step 2 runs: it now reserves new slots
    assert all(r.kv_allocated_len > before for r, before in zip(reqs, allocated_before, strict=False))
    assert torch.equal(req_to_token[rows.unsqueeze(1), window], read_by_step2)
    assert mwb2.out_cache_loc.tolist() == read_by_step2[:, 0].tolist()
    _assert_new_slots_avoid(req_to_token, reqs, allocated_before, read_by_step2, mwb1.out_cache_loc)

    result2 = finish(entry2, [500, 501, 502])
    assert scheduler._resolve_spec_overlap_token_ids(result2, batch) == [[500], [501], [502]]
    assert [r.kv_committed_len for r in reqs] == (s2 + 1).tolist()


def _draft_input_like_draft_extend(result, n):
    # The draft extend fills the proposals for the next step (topk 1).
    result.next_draft_input.topk_p = torch.rand(n, 1)
    result.next_draft_input.topk_index = torch.randint(0, 500, (n, 1))
    result.next_draft_input.hidden_states = torch.randn(n, HIDDEN)


def test_future_map_keeps_shapes_and_dtypes_across_a_switch(env):
    from sglang.srt.managers.overlap_utils import FutureMap
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    batch, _ = v2_decode_batch(env)
    future_map = FutureMap(16, 256, 1024, torch.device("cpu"), SpeculativeAlgorithm.EAGLE3)
    # A speculative step's draft input initialises the buffers, as it does in the server.
    spec_indices = future_map.alloc_future_indices(NUM_REQS)
    future_map.store_to_map_for_new_batch(spec_indices, batch.spec_info)

    _, _, result = _fallback(batch, [200 + i for i in range(NUM_REQS)])
    _draft_input_like_draft_extend(result, NUM_REQS)
    fallback_indices = future_map.alloc_future_indices(NUM_REQS)
    future_map.store_to_map(fallback_indices, result)

    def resolved(indices):
        mwb = types.SimpleNamespace(spec_info=EagleDraftInput(future_indices=indices))
        indices.indices.record_stream = lambda stream: None  # CPU tensors have no streams
        future_map.resolve_future(mwb)
        return mwb.spec_info

    before, after = resolved(spec_indices), resolved(fallback_indices)
    for name in ("topk_p", "topk_index", "verified_id", "new_seq_lens", "hidden_states"):
        a, b = getattr(before, name), getattr(after, name)
        assert (a.shape, a.dtype) == (b.shape, b.dtype), name
    assert after.verified_id.tolist() == [200 + i for i in range(NUM_REQS)]


def test_one_step_late_processing_across_switches(env):
    """spec -> fallback -> spec: tokens, kv_committed_len and acceptance counters stay right."""
    from sglang.srt.managers.utils import GenerationBatchResult

    batch, reqs = v2_decode_batch(env, n=3)
    scheduler = scheduler_for_output_processing()
    committed = [r.kv_committed_len for r in reqs]

    n = NUM_DRAFT_TOKENS
    spec_tokens = torch.arange(3 * n, dtype=torch.int64) + 300
    spec = GenerationBatchResult(next_token_ids=spec_tokens, accept_lens=torch.tensor([3, 1, 2], dtype=torch.int32))
    got = scheduler._resolve_spec_overlap_token_ids(spec, batch)
    assert got == [[300, 301, 302], [304], [308, 309]]
    assert [r.spec_verify_ct for r in reqs] == [1, 1, 1]
    assert [r.spec_accepted_tokens for r in reqs] == [2, 0, 1]

    _, _, fallback = _fallback(batch, [400, 401, 402])
    got = scheduler._resolve_spec_overlap_token_ids(fallback, batch)
    assert got == [[400], [401], [402]]
    assert fallback.num_accepted_tokens == 0
    # A fallback step verified nothing: the per-request acceptance stats do not move.
    assert [r.spec_verify_ct for r in reqs] == [1, 1, 1]
    assert [r.spec_accepted_tokens for r in reqs] == [2, 0, 1]

    again = GenerationBatchResult(next_token_ids=spec_tokens, accept_lens=torch.tensor([1, 4, 1], dtype=torch.int32))
    scheduler._resolve_spec_overlap_token_ids(again, batch)
    assert [r.spec_verify_ct for r in reqs] == [2, 2, 2]
    assert [r.kv_committed_len - c for r, c in zip(reqs, committed, strict=False)] == [
        3 + 1 + 1,
        1 + 1 + 4,
        2 + 1 + 1,
    ]


def test_next_decode_after_fallback_reserves_from_the_new_length(env):
    """The scheduler's next prepare_for_decode over-allocates from kv_committed_len + 1."""
    from sglang.srt.managers.utils import get_alloc_len_per_decode

    batch, reqs = v2_decode_batch(env, n=3)
    scheduler = scheduler_for_output_processing()
    _, _, fallback = _fallback(batch, [400, 401, 402])
    scheduler._resolve_spec_overlap_token_ids(fallback, batch)
    # resolve_future hands the next batch the fallback's new lengths.
    batch.seq_lens = fallback.next_draft_input.new_seq_lens
    batch.spec_info = fallback.next_draft_input
    batch.prepare_for_decode()

    reserve = 2 * get_alloc_len_per_decode()
    for req, seq_len in zip(reqs, batch.seq_lens.tolist(), strict=False):
        assert req.kv_committed_len == seq_len
        assert req.kv_allocated_len == req.kv_committed_len + reserve
        row = batch.req_to_token_pool.req_to_token[req.req_pool_idx]
        assert (row[seq_len : req.kv_allocated_len] > 0).all()
