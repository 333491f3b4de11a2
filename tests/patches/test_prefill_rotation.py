"""A prefill batch's ids turned into its draft extend's in one pass (0017), on both EAGLE workers.

The batches are real prefills: new requests of several lengths beside the second chunk of a
chunked one (its first chunk prefilled and kept by the chunk cache, as the scheduler's chunked
prefill does), so a request's extended ids start past its prefix. Each request's draft extend must
read its extended ids shifted left by one and the token sampled after them last: v1 through
EagleDraftInput.prepare_for_extend, v2 through EagleDraftWorker._draft_extend_for_prefill (its
draft model's forward batch recorded). And the ops it runs must not grow with the batch: the
per-request slice and cat it replaces launched two kernels a request.
"""

from __future__ import annotations

import pytest
import torch
from draft_prefill_cpu import DraftRunner
from launches import LaunchedOps

from sglang_cpu import HIDDEN, VOCAB, init_single_rank_groups, make_req
from switch_helpers import v2_env

CHUNK, CHUNKED_PROMPT = 5, 12


@pytest.fixture
def env(tmp_path, monkeypatch):
    pools = v2_env(tmp_path, monkeypatch)
    init_single_rank_groups()  # the draft's logits processor asks for its TP group
    return pools


def _extend(env, reqs):
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    batch = ScheduleBatch.init_new(
        reqs, env.req_to_token_pool, env.allocator, env.tree_cache, env.model_config,
        enable_overlap=True, spec_algorithm=SpeculativeAlgorithm.EAGLE3,
    )  # fmt: skip
    batch.prepare_for_extend()
    return batch


def _second_chunk(env):
    """A request whose first CHUNK prompt tokens were prefilled as a chunk, as it enters its next
    prefill batch (Scheduler.get_new_batch_prefill: PrefillAdder's truncation, the chunk cache's
    cache_unfinished_req, init_next_round_input)."""
    req = make_req("chunked", CHUNKED_PROMPT)
    req.init_next_round_input(env.tree_cache)
    req.set_extend_input_len(CHUNK)
    req.fill_ids = req.fill_ids[:CHUNK]
    _extend(env, [req])
    env.tree_cache.cache_unfinished_req(req, chunked=True)
    req.init_next_round_input()
    return req


def _prefill(env, lengths, chunked=True):
    reqs = [_second_chunk(env)] if chunked else []
    for i, n in enumerate(lengths):
        req = make_req(f"r{i}", n)
        req.init_next_round_input(env.tree_cache)
        reqs.append(req)
    batch = _extend(env, reqs)
    sampled = torch.arange(len(reqs), dtype=torch.int64) + VOCAB - len(reqs)
    # Each request's draft reads its extended ids from the second on, then what it sampled.
    want = [
        t
        for req, s in zip(reqs, sampled.tolist(), strict=True)
        for t in [*req.fill_ids[len(req.prefix_indices) + 1 :], s]
    ]
    return batch, sampled, want


def test_the_v1_draft_reads_each_requests_ids_shifted_and_its_sampled_token(env):
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    batch, sampled, want = _prefill(env, [6, 1, 9])
    assert batch.extend_lens[0] == CHUNKED_PROMPT - CHUNK and batch.prefix_lens[0] == CHUNK
    ids = batch.input_ids
    EagleDraftInput(verified_id=sampled.to(torch.int32)).prepare_for_extend(batch)
    assert batch.input_ids.tolist() == want
    assert batch.input_ids is ids, "rotated in place, as the batch's other holders see it"


def test_the_v2_draft_extend_reads_each_requests_ids_shifted_and_its_sampled_token(env):
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    batch, sampled, want = _prefill(env, [6, 1, 9])
    mwb = batch.get_model_worker_batch()
    mwb.capture_hidden_mode = CaptureHiddenMode.LAST
    worker = object.__new__(EagleDraftWorker)
    worker.draft_runner, worker.topk = DraftRunner(env, VOCAB), 1
    worker._draft_extend_for_prefill(mwb, torch.randn(len(want), 3 * HIDDEN), sampled)
    (forward_batch,) = worker.draft_runner.forward_batches
    assert forward_batch.input_ids.tolist() == want


def test_the_rotation_runs_as_many_ops_for_a_batch_of_eight_as_for_two(env):
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    counts = []
    for lengths in ([7, 3], [7, 3, 8, 1, 5, 6, 2, 9]):
        batch, sampled, want = _prefill(env, lengths, chunked=False)
        draft = EagleDraftInput(verified_id=sampled.to(torch.int32))
        with LaunchedOps() as launched:
            draft.prepare_for_extend(batch)
        assert batch.input_ids.tolist() == want
        counts.append(launched.ops)
    assert len(counts[0]) == len(counts[1]), f"ops for two requests and for eight: {[len(c) for c in counts]}"
