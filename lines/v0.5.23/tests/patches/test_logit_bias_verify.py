"""logit_bias on the v2 worker's verify: the biased token wins at every draft position. Upstream
0.5.23 does this already (it applies the bias row at every position since 0.5.11); the test pins it.

EAGLEWorkerV2.forward_batch_generation with its own verify (run_eagle_verify, eagle_sample) on a
batch the overlap loop prefilled and prepared (spec_v2_cpu); the models are stood in for.
"""

from __future__ import annotations

import pytest
from spec_v2_cpu import spec_v2_server

from sglang_cpu import make_req

FAVOURED = 5  # the raw logits' argmax everywhere
BIASED = 77
GREEDY = {"temperature": 0.0}
NUM_DRAFT = 4


@pytest.fixture
def env(tmp_path, monkeypatch):
    return spec_v2_server(tmp_path, monkeypatch, speculative_num_draft_tokens=NUM_DRAFT)


def _accepted(env, reqs, drafts):
    """The tokens one verify step emits per request."""
    env.model.plan = lambda fb: [100 + i for i in range(len(reqs))]
    batch = env.loop.prefill(reqs)
    env.loop.prepare_decode(batch)
    env.draft.draft_tokens = drafts
    env.model.plan = lambda fb: [FAVOURED] * (len(reqs) * NUM_DRAFT)
    result = env.loop.run(batch)
    tokens = result.next_token_ids.view(len(reqs), NUM_DRAFT)
    return [tokens[b, : int(n)].tolist() for b, n in enumerate(result.accept_lens)]


def test_biased_token_is_accepted_at_every_draft_position(env):
    reqs = [
        make_req("biased", 6, sampling={**GREEDY, "logit_bias": {str(BIASED): 100.0}}),
        make_req("plain", 7, sampling=GREEDY),
    ]
    accepted = _accepted(env, reqs, [[BIASED] * 3, [BIASED] * 3])
    # The bias lifts the token over the raw favourite at each position a plain decode would sample.
    assert accepted[0] == [BIASED] * NUM_DRAFT
    # A request without bias in the same batch keeps the raw argmax and rejects the drafts.
    assert accepted[1] == [FAVOURED]


def test_negative_bias_bans_the_favourite_at_every_position(env):
    reqs = [make_req("banned", 6, sampling={**GREEDY, "logit_bias": {str(FAVOURED): -100.0}})]
    accepted = _accepted(env, reqs, [[FAVOURED] * 3])
    # No draft is accepted (each proposes the banned token) and the bonus is not the banned one.
    assert len(accepted[0]) == 1 and accepted[0][0] != FAVOURED
