"""A request asking for logprobs, through the EAGLE-3 draft's prefill extend (0007).

The batch is a real prefill (Req, ScheduleBatch.prepare_for_extend, ForwardBatch.init_new) with
one request asking for logprobs; the logits processor is SGLang's own. What stands in for the
draft model is only its layers: a projection that makes hidden states, handed to the real
LogitsProcessor as LlamaForCausalLMEagle3.forward hands them (logits states plus one aux state).
"""

from __future__ import annotations

import pytest
import torch
from draft_prefill_cpu import DraftRunner

from sglang_cpu import (
    HIDDEN,
    VOCAB,
    init_single_rank_groups,
    make_pools,
    make_req,
    make_server_args,
    write_tiny_llama_config,
)

PROMPT_LENS = (6, 9, 5)
ASKING = 1  # the index of the request that asks for logprobs
# EAGLE-3 drafts often predict a subset of the target's vocabulary (d2t maps it back).
DRAFT_VOCAB = 16  # below most prompt token ids here, as a real hot vocabulary is below most ids

# (logprob_start_len as sent, top_logprobs_num, token_ids_logprob): output logprobs only (what an
# OpenAI-API client's `logprobs` sends), from the prompt start, from the middle, specific ids.
REQUESTS = {
    "output-only": (-1, 0, None),
    "output-top3": (-1, 3, None),
    "from-start-top3": (0, 3, None),
    "from-middle": (4, 0, None),
    "token-ids": (-1, 0, [11, 12]),
}


@pytest.fixture
def env(tmp_path):
    model_path = write_tiny_llama_config(tmp_path / "model")
    server_args = make_server_args(
        model_path,
        speculative_eagle_topk=1,
        speculative_num_steps=3,
        speculative_num_draft_tokens=4,
        disable_overlap_schedule=False,
    )
    init_single_rank_groups()
    return make_pools(server_args)


def _logprob_start_len_as_scheduled(req, sent: int) -> int:
    # Scheduler.handle_generate_request: -1 means output logprobs only, unless token ids are
    # asked for, in which case it stays -1 and set_extend_input_len counts the last row.
    if sent == -1 and req.token_ids_logprob is None:
        return len(req.origin_input_ids) - 1
    return sent


def _prefill_batch(env, asks: tuple | None):
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    reqs = []
    for i, prompt_len in enumerate(PROMPT_LENS):
        if i == ASKING and asks is not None:
            start, top, token_ids = asks
            req = make_req(f"r{i}", prompt_len, return_logprob=True, top_logprobs_num=top)
            req.token_ids_logprob = token_ids
            req.logprob_start_len = _logprob_start_len_as_scheduled(req, start)
        else:
            req = make_req(f"r{i}", prompt_len)
        req.init_next_round_input(env.tree_cache)
        reqs.append(req)
    batch = ScheduleBatch.init_new(
        reqs,
        env.req_to_token_pool,
        env.allocator,
        env.tree_cache,
        env.model_config,
        enable_overlap=True,
        spec_algorithm=SpeculativeAlgorithm.EAGLE3,
    )
    batch.prepare_for_extend()
    assert batch.seq_lens.tolist() == list(PROMPT_LENS)
    return batch.get_model_worker_batch()


def _forward(env, runner, asks):
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch

    mwb = _prefill_batch(env, asks)
    mwb.capture_hidden_mode = CaptureHiddenMode.LAST  # the v2 draft prefill's mode
    forward_batch = ForwardBatch.init_new(mwb, runner)
    return forward_batch, runner.forward(forward_batch)


@pytest.mark.parametrize("asks", REQUESTS.values(), ids=REQUESTS.keys())
def test_input_logprob_branch_keeps_the_last_rows_aux_states(env, asks):
    from sglang.srt.layers.logits_processor import LogitsMetadata

    runner = DraftRunner(env, VOCAB)
    forward_batch, out = _forward(env, runner, asks)
    # Every kind of logprob request takes the branch 0.5.9 left without aux states.
    assert LogitsMetadata.from_forward_batch(forward_batch).extend_return_logprob

    last_rows = torch.cumsum(torch.tensor(PROMPT_LENS), 0) - 1
    stored = out.logits_output.hidden_states
    assert stored.shape == (len(PROMPT_LENS), 3 * HIDDEN)
    torch.testing.assert_close(stored, out.aux[last_rows])
    # The same batch without the logprob request stores the same states (the branch that worked).
    _, plain = _forward(env, DraftRunner(env, VOCAB), None)
    torch.testing.assert_close(stored, plain.logits_output.hidden_states)
    torch.testing.assert_close(out.logits_output.next_token_logits, plain.logits_output.next_token_logits)


@pytest.mark.parametrize("asks", REQUESTS.values(), ids=REQUESTS.keys())
def test_v2_draft_prefill_serves_a_logprob_request(env, asks):
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    worker = object.__new__(EagleDraftWorker)
    worker.draft_runner = DraftRunner(env, DRAFT_VOCAB)
    worker.topk = 1
    mwb = _prefill_batch(env, asks)
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    mwb.capture_hidden_mode = CaptureHiddenMode.LAST
    n = len(PROMPT_LENS)
    next_token_ids = torch.arange(n, dtype=torch.int64) + 20
    target_hidden = torch.randn(sum(PROMPT_LENS), 3 * HIDDEN)

    draft_input = worker._draft_extend_for_prefill(mwb, target_hidden, next_token_ids)

    # The draft never computes logprobs (the target returns them; its vocabulary is smaller).
    (forward_batch,) = worker.draft_runner.forward_batches
    assert not forward_batch.return_logprob
    assert mwb.return_logprob  # the target's batch still asks
    assert draft_input.hidden_states.shape == (n, 3 * HIDDEN)
    assert draft_input.topk_index.shape == (n, 1)
    assert int(draft_input.topk_index.max()) < DRAFT_VOCAB
