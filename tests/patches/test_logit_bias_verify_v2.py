"""logit_bias on the v2 worker's verify (0010): the biased token wins at every draft position.

A real overlap-scheduled batch (prefill, then the v2 decode preparation) whose sampling info is
the scheduler's forward copy; the verify input is the chain a topk-1 draft builds. Only the
greedy tree walk (a native kernel) runs as a torch reference.
"""

from __future__ import annotations

import pytest
import torch
from verify_cpu import logits_favouring, use_torch_verify, verify_input

from sglang_cpu import make_req, prefilled_decode_batch
from switch_helpers import NUM_DRAFT_TOKENS, v2_env

FAVOURED = 5  # the raw logits' argmax everywhere
BIASED = 77
GREEDY = {"temperature": 0.0}


@pytest.fixture
def env(tmp_path, monkeypatch):
    env = v2_env(tmp_path, monkeypatch)
    use_torch_verify(monkeypatch)
    return env


def _verify(env, reqs, drafts):
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    batch = prefilled_decode_batch(env, reqs, [100 + i for i in range(len(reqs))], overlap=True, topk=1)
    mwb = batch.get_model_worker_batch()
    # What the overlap scheduler hands the worker.
    mwb.sampling_info = mwb.sampling_info.copy_for_forward()
    draft_tokens = torch.tensor(drafts, dtype=torch.int64)
    chain = verify_input(draft_tokens, batch.seq_lens)
    logits = logits_favouring(len(reqs) * NUM_DRAFT_TOKENS, FAVOURED)
    predict, accept_length, accept_index = chain.sample(mwb, LogitsProcessorOutput(next_token_logits=logits))
    return [predict[accept_index[b, : int(accept_length[b])]].tolist() for b in range(len(reqs))]


def test_biased_token_is_accepted_at_every_draft_position(env):
    reqs = [
        make_req("biased", 6, sampling={**GREEDY, "logit_bias": {str(BIASED): 100.0}}),
        make_req("plain", 7, sampling=GREEDY),
    ]
    root = 100
    accepted = _verify(env, reqs, [[root, BIASED, BIASED, BIASED], [root + 1, BIASED, BIASED, BIASED]])
    # The bias lifts the token over the raw favourite at each position a plain decode would sample.
    assert accepted[0] == [BIASED] * NUM_DRAFT_TOKENS
    # A request without bias in the same batch keeps the raw argmax and rejects the drafts.
    assert accepted[1] == [FAVOURED]


def test_negative_bias_bans_the_favourite_at_every_position(env):
    reqs = [make_req("banned", 6, sampling={**GREEDY, "logit_bias": {str(FAVOURED): -100.0}})]
    accepted = _verify(env, reqs, [[100, FAVOURED, FAVOURED, FAVOURED]])
    # No draft is accepted (each proposes the banned token) and the bonus is not the banned one.
    assert len(accepted[0]) == 1 and accepted[0][0] != FAVOURED
