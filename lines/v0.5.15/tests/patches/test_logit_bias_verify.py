"""logit_bias under speculation (v0.5.15 line, upstream's own behaviour): the biased token wins at
every draft position of the verify, as at every step of a plain decode.

The v0.5.9 line needed a patch for this (its 0010, upstream since v0.5.11); here it confirms that
0.5.15's eagle_sample still adds each request's bias to all of its draft rows. A real prefill and
decode preparation, EAGLEWorkerV2's verify on the chain a topk-1 draft builds, the output processor;
the target's logits are the test's and the native greedy tree walk runs as a torch reference.
"""

from __future__ import annotations

import pytest
from spec_v2_cpu import spec_v2_server

from sglang_cpu import make_req

FAVOURED = 5  # the raw logits' argmax everywhere
BIASED = 77


@pytest.fixture
def env(tmp_path, monkeypatch):
    return spec_v2_server(tmp_path, monkeypatch)


def _accepted(env, sampling, chain):
    """The tokens one speculative step after the prefill accepts for each request."""
    loop, model = env.loop, env.model
    reqs = [make_req(f"r{i}", 6 + i, sampling={"temperature": 0.0, **s}) for i, s in enumerate(sampling)]
    model.plan = lambda fb: [100 + i for i in range(len(reqs))]
    batch = loop.prefill(reqs)
    loop.prepare_decode(batch)

    env.draft.draft_tokens = [chain] * len(reqs)
    model.plan = lambda fb: [FAVOURED] * len(fb.input_ids)
    loop.run(batch)  # and the prefill's output
    loop.flush()  # the step's
    return [list(req.output_ids[1:]) for req in reqs]


def test_biased_token_is_accepted_at_every_draft_position(env):
    accepted = _accepted(env, [{"logit_bias": {str(BIASED): 100.0}}, {}], [BIASED] * 3)
    # The bias lifts the token over the raw favourite at each position a plain decode would sample.
    assert accepted[0] == [BIASED] * 4
    # A request without bias in the same batch keeps the raw argmax and rejects the drafts.
    assert accepted[1] == [FAVOURED]


def test_negative_bias_bans_the_favourite_at_every_position(env):
    accepted = _accepted(env, [{"logit_bias": {str(FAVOURED): -100.0}}], [FAVOURED] * 3)
    # No draft is accepted (each proposes the banned token) and the bonus is not the banned one.
    assert len(accepted[0]) == 1 and accepted[0][0] != FAVOURED
