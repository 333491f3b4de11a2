"""Tensor-shape regression tests for the v1 EAGLE speculation switch, on CPU.

Real SGLang batches go through the patched fallback step across the threshold; the target's
sampled tokens and hidden states are inputs the test chooses (the model forward needs a GPU).
"""

from __future__ import annotations

import pytest
import torch

from sglang_cpu import (
    HIDDEN,
    make_pools,
    make_req,
    make_server_args,
    prefilled_decode_batch,
    use_torch_kernels,
    write_tiny_llama_config,
)

NUM_REQS = 10  # the seed's crash: 10 requests x 16 draft tokens
NUM_DRAFT_TOKENS = 16
TOPK = 4
STEPS = 3


@pytest.fixture
def env(tmp_path, monkeypatch):
    model_path = write_tiny_llama_config(tmp_path / "model")
    server_args = make_server_args(model_path)
    use_torch_kernels(monkeypatch)
    return make_pools(server_args)


def _snapshot(batch):
    return {
        "seq_lens": batch.seq_lens.clone(),
        "seq_lens_cpu": batch.seq_lens_cpu.clone(),
        "seq_lens_sum": batch.seq_lens_sum,
        "kv_committed": [r.kv_committed_len for r in batch.reqs],
        "kv_allocated": [r.kv_allocated_len for r in batch.reqs],
        "decode_idx": [r.decode_batch_idx for r in batch.reqs],
        "pending": batch.spec_info.verified_id.tolist(),
        "free": batch.token_to_kv_pool_allocator.available_size(),
    }


def assert_plain_decode_step(batch, model_worker_batch, before):
    """What a plain decode step of `bs` requests must look like (issue 4, point 3)."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

    bs = len(batch.reqs)
    assert model_worker_batch.input_ids.shape == (bs,), (
        f"input_ids has {model_worker_batch.input_ids.shape[0]} rows for {bs} requests"
    )
    assert model_worker_batch.forward_mode == ForwardMode.DECODE
    assert model_worker_batch.spec_info is None
    assert model_worker_batch.capture_hidden_mode == CaptureHiddenMode.FULL
    assert model_worker_batch.input_ids.dtype == torch.int64
    assert model_worker_batch.input_ids.tolist() == before["pending"]
    assert model_worker_batch.out_cache_loc.shape == (bs,)
    assert model_worker_batch.seq_lens.shape == (bs,)
    assert torch.equal(model_worker_batch.seq_lens, before["seq_lens"] + 1)
    assert torch.equal(batch.seq_lens_cpu, before["seq_lens_cpu"] + 1)
    assert batch.seq_lens_sum == before["seq_lens_sum"] + bs
    assert [r.kv_committed_len for r in batch.reqs] == [k + 1 for k in before["kv_committed"]]
    assert [r.kv_allocated_len for r in batch.reqs] == [k + 1 for k in before["kv_allocated"]]
    assert [r.decode_batch_idx for r in batch.reqs] == [k + 1 for k in before["decode_idx"]]
    assert batch.token_to_kv_pool_allocator.available_size() == before["free"] - bs
    # The new slot sits at position s of each request's row: where the pending token goes.
    rows = batch.req_to_token_pool.req_to_token[batch.req_pool_indices, before["seq_lens"].long()]
    assert torch.equal(rows.long(), model_worker_batch.out_cache_loc.long())


def _fallback_step(batch, sampled, *, hidden_width=3 * HIDDEN):
    from sglang.srt.speculative.spec_switch import (
        commit_plain_decode_v1,
        prepare_plain_decode_v1,
        set_draft_input_after_plain_decode_v1,
    )

    before = _snapshot(batch)
    mwb, draft_input = prepare_plain_decode_v1(batch)
    assert_plain_decode_step(batch, mwb, before)
    next_ids = torch.tensor(sampled, dtype=torch.int64)
    hidden = torch.randn(len(batch.reqs), hidden_width)
    logits_output = _LogitsOutput(hidden_states=hidden)
    unfinished = commit_plain_decode_v1(batch, next_ids, logits_output)
    set_draft_input_after_plain_decode_v1(batch, draft_input, next_ids, hidden, unfinished)
    return before, unfinished, hidden


class _LogitsOutput:
    """The fields of LogitsProcessorOutput the bookkeeping reads (the model's output)."""

    def __init__(self, hidden_states, logprobs=None):
        self.hidden_states = hidden_states
        self.next_token_logprobs = logprobs
        self.next_token_top_logprobs_val = None
        self.next_token_top_logprobs_idx = None


def _draft_extend_inputs(batch):
    """Run SGLang's own draft-extend preparation and return what the draft forward would get."""
    spec_info = batch.spec_info
    seq_lens, seq_lens_cpu, pool_idx = batch.seq_lens, batch.seq_lens_cpu, batch.req_pool_indices
    spec_info.prepare_extend_after_decode(batch, STEPS)
    inputs = {
        "input_ids": batch.input_ids.clone(),
        "positions": spec_info.positions.clone(),
        "extend_lens": list(batch.extend_lens),
        "seq_lens": batch.seq_lens.clone(),
        "out_cache_loc": batch.out_cache_loc.clone(),
        "verified_id": spec_info.verified_id.clone(),
        "hidden": spec_info.hidden_states,
    }
    # forward_draft_extend_after_decode restores these after the draft forward.
    batch.seq_lens, batch.seq_lens_cpu, batch.req_pool_indices = seq_lens, seq_lens_cpu, pool_idx
    spec_info.accept_length.sub_(1)
    # capture_for_decode: the draft's proposals for the next step.
    n = len(spec_info.verified_id)
    spec_info.topk_p = torch.full((n, TOPK), 1.0 / TOPK)
    spec_info.topk_index = torch.arange(TOPK).repeat(n, 1) + 20
    spec_info.hidden_states = torch.randn(n, HIDDEN)
    return inputs


def _eagle_worker_for_preprocess(pools):
    from sglang.srt.speculative.eagle_worker import EAGLEWorker

    worker = object.__new__(EAGLEWorker)
    worker.page_size = 1
    worker.topk = TOPK
    worker.speculative_num_steps = STEPS
    worker.device = "cpu"
    worker.token_to_kv_pool_allocator = pools.allocator
    worker.extend_lens = torch.empty((), dtype=torch.int64)
    worker.num_new_pages_per_topk = torch.empty((), dtype=torch.int64)
    return worker


def _assert_prefilled(batch, reqs):
    """Real sequences: lengths of the prompts, each with its own allocated KV slots."""
    lens = [len(r.origin_input_ids) for r in reqs]
    assert batch.seq_lens.tolist() == lens and min(lens) > 0
    slots = [
        batch.req_to_token_pool.req_to_token[int(i), :n] for i, n in zip(batch.req_pool_indices, lens, strict=False)
    ]
    flat = torch.cat(slots)
    assert flat.unique().numel() == sum(lens) and int(flat.min()) > 0  # slot 0 is the padding slot


def test_seed_case_fallback_is_a_plain_decode_and_draft_resyncs(env):
    """10 requests, 16 draft tokens: the batch the seed's naive fallback crashed on."""
    reqs = [make_req(f"r{i}", prompt_len=5 + i) for i in range(NUM_REQS)]
    batch = prefilled_decode_batch(env, reqs, first_tokens=[100 + i for i in range(NUM_REQS)])
    _assert_prefilled(batch, reqs)
    sampled = [200 + i for i in range(NUM_REQS)]

    before, unfinished, hidden = _fallback_step(batch, sampled)

    assert unfinished == list(range(NUM_REQS))
    assert [r.output_ids[-1] for r in reqs] == sampled
    # Draft sync: one token per request at position s, the target's hidden state, the new slot.
    extend = _draft_extend_inputs(batch)
    assert extend["input_ids"].tolist() == sampled
    assert extend["positions"].tolist() == before["seq_lens"].tolist()
    assert extend["extend_lens"] == [1] * NUM_REQS
    assert torch.equal(extend["seq_lens"], before["seq_lens"] + 1)
    assert extend["out_cache_loc"].shape == (NUM_REQS,)
    assert extend["verified_id"].tolist() == sampled
    assert torch.equal(extend["hidden"], hidden)


def test_speculation_resumes_after_fallback(env):
    """After a fallback step the batch is valid for the next speculative step."""
    reqs = [make_req(f"r{i}", prompt_len=5 + i) for i in range(NUM_REQS)]
    batch = prefilled_decode_batch(env, reqs, first_tokens=[100 + i for i in range(NUM_REQS)])
    before, _, _ = _fallback_step(batch, [200 + i for i in range(NUM_REQS)])
    _draft_extend_inputs(batch)

    worker = _eagle_worker_for_preprocess(env)
    seq_lens = batch.seq_lens.clone()
    worker._draft_preprocess_decode(batch)

    assert torch.equal(seq_lens, before["seq_lens"] + 1)
    assert batch.out_cache_loc.shape == (NUM_REQS * TOPK * STEPS,)
    assert batch.spec_info.positions.tolist() == seq_lens.repeat_interleave(TOPK).tolist()
    assert batch.spec_info.verified_id.shape == (NUM_REQS,)
    assert batch.spec_info.topk_p.shape == (NUM_REQS, TOPK)
    assert batch.spec_info.hidden_states.shape == (NUM_REQS, HIDDEN)


def test_finished_requests_leave_the_draft_input_in_order(env):
    """A request that stops drops out of the draft input the way verify drops it."""
    reqs = [
        make_req("a", 6),
        make_req("b", 7, max_new_tokens=2),  # prefill token + this step: done
        make_req("c", 8, stop_token_ids=[300]),
        make_req("d", 9),
    ]
    batch = prefilled_decode_batch(env, reqs, first_tokens=[101, 102, 103, 104])
    before, unfinished, hidden = _fallback_step(batch, [201, 202, 300, 204])

    assert unfinished == [0, 3]
    assert reqs[1].finished() and reqs[2].finished()
    assert not reqs[0].finished() and not reqs[3].finished()
    assert batch.spec_info.verified_id.tolist() == [201, 204]
    assert torch.equal(batch.spec_info.hidden_states, hidden[[0, 3]])
    assert batch.out_cache_loc.shape == (2,)
    assert batch.spec_info.seq_lens_for_draft_extend.tolist() == (before["seq_lens"][[0, 3]] + 1).tolist()

    # The scheduler's filter keeps the running requests and truncates the draft input to them.
    _draft_extend_inputs(batch)
    batch.filter_batch(v1_spec_info_filtered=True)
    assert [r.rid for r in batch.reqs] == ["a", "d"]
    assert batch.spec_info.verified_id.tolist() == [201, 204]


def test_penalties_advance_by_exactly_the_pending_token(env):
    reqs = [make_req(f"r{i}", 5, sampling={"frequency_penalty": 0.5, "temperature": 0.7}) for i in range(3)]
    batch = prefilled_decode_batch(env, reqs, first_tokens=[100, 101, 102])
    orchestrator = batch.sampling_info.penalizer_orchestrator
    assert orchestrator.is_required
    penalizer = next(p for p in orchestrator.penalizers.values() if p.is_prepared())
    counts_before = penalizer.cumulated_frequency_penalties.clone()

    _fallback_step(batch, [200, 201, 202])

    delta = penalizer.cumulated_frequency_penalties - counts_before
    assert delta.nonzero().tolist() == [[0, 100], [1, 101], [2, 102]]


def test_logprobs_are_returned_for_fallback_tokens(env):
    from sglang.srt.speculative.spec_switch import (
        commit_plain_decode_v1,
        prepare_plain_decode_v1,
    )

    reqs = [make_req("a", 5, return_logprob=True), make_req("b", 6)]
    batch = prefilled_decode_batch(env, reqs, first_tokens=[100, 101])
    prepare_plain_decode_v1(batch)
    out = _LogitsOutput(torch.randn(2, 3 * HIDDEN), logprobs=torch.tensor([-0.5, -1.5]))
    commit_plain_decode_v1(batch, torch.tensor([200, 201]), out)

    assert reqs[0].output_token_logprobs_val == [-0.5]
    assert reqs[0].output_token_logprobs_idx == [200]
    assert not reqs[1].output_token_logprobs_val


def test_naive_fallback_fails_these_checks_with_the_seed_shape_mismatch(env):
    """The seed's bug: clear spec_info and run the batch as the speculative step left it."""
    reqs = [make_req(f"r{i}", prompt_len=5 + i) for i in range(NUM_REQS)]
    batch = prefilled_decode_batch(env, reqs, first_tokens=[100 + i for i in range(NUM_REQS)])
    _assert_prefilled(batch, reqs)
    # A speculative step accepted all 15 drafts plus the bonus token of every request: the
    # draft extend after it leaves input_ids/out_cache_loc in the flat accepted layout.
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    accepted = NUM_DRAFT_TOKENS
    batch.spec_info = EagleDraftInput(
        hidden_states=torch.randn(NUM_REQS * accepted, 3 * HIDDEN),
        verified_id=torch.arange(NUM_REQS * accepted, dtype=torch.int32) + 10,
        accept_length=torch.full((NUM_REQS,), accepted - 1, dtype=torch.int32),
        accept_length_cpu=[accepted - 1] * NUM_REQS,
        seq_lens_for_draft_extend=batch.seq_lens + accepted,
        seq_lens_for_draft_extend_cpu=batch.seq_lens_cpu + accepted,
        req_pool_indices_for_draft_extend=batch.req_pool_indices,
    )
    _draft_extend_inputs(batch)
    before = _snapshot(batch)

    batch.spec_info = None  # the naive fallback
    naive = batch.get_model_worker_batch()
    # 160 input rows against 10 sequences: the mismatch the seed's server crashed on.
    with pytest.raises(AssertionError, match=r"input_ids has 160 rows for 10 requests"):
        assert_plain_decode_step(batch, naive, before)
    assert naive.seq_lens.shape == (NUM_REQS,)


def test_batch_whose_requests_all_finish_still_merges_with_new_requests(env):
    """Found on the H200: when every request finished in a fallback step, the leftover draft
    input kept the target's 3H-wide hidden states, and merging the next prefill's draft input
    (H wide) into the running batch raised "Sizes of tensors must match"."""
    reqs = [make_req("a", 5, max_new_tokens=2), make_req("b", 6, max_new_tokens=2)]
    batch = prefilled_decode_batch(env, reqs, first_tokens=[100, 101])
    _, unfinished, _ = _fallback_step(batch, [200, 201])
    assert unfinished == [] and all(r.finished() for r in reqs)
    batch.filter_batch(v1_spec_info_filtered=True)

    new_reqs = [make_req("c", 7), make_req("d", 8)]
    new_batch = prefilled_decode_batch(env, new_reqs, first_tokens=[102, 103])
    new_batch.spec_info.hidden_states = torch.randn(2, HIDDEN)
    batch.merge_batch(new_batch)

    assert [r.rid for r in batch.reqs] == ["c", "d"]
    assert batch.spec_info.hidden_states.shape == (2, HIDDEN)
    assert batch.spec_info.verified_id.tolist() == [102, 103]
