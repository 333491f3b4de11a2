"""Penalties under speculative decoding on the v2 worker (0003): each step's emitted tokens counted
once before the next step samples, and each verify row penalised as plain decoding would.

Real SGLang 0.5.23 objects on CPU, scheduled as the overlap loop schedules them (spec_v2_cpu's
OverlapLoop): a prefill through the worker's own prefill path, the scheduler's decode preparation,
its forward copy of the sampling info, then EAGLEWorkerV2.forward_batch_generation with its own
verify (run_eagle_verify, eagle_prepare_for_verify, eagle_sample); filter, merge with a new prefill,
upstream's steps=0 verify and the v0.5.23 line's plain decode (0002). The two models are stood in
for (their logits are the test's) and the verify kernels run as torch references.

The reference is SGLang's own plain-decode path for one request: its orchestrator counts each
emitted token with one `cumulate_output_tokens`, and the sampler applies the forward copy's rows
(`copy_for_forward`, then `apply_logits_bias`), as an overlap plain server's sampler does; where the
order of the penalties cannot matter it is checked against `orchestrator.apply` too, which a
non-overlap plain server calls.
"""

from __future__ import annotations

import pytest
import torch
from spec_v2_cpu import spec_v2_server

from sglang_cpu import VOCAB, make_req

SAMPLING = [
    {"frequency_penalty": 0.7},
    {"presence_penalty": 0.9},
    {"frequency_penalty": 0.3, "presence_penalty": 0.5, "min_new_tokens": 4},
    {"repetition_penalty": 1.3, "frequency_penalty": 0.2},  # scaling after the additive rows
    {},  # no penalty, in the same batch
]
FIRST = [30, 31, 30, 33, 34]  # the prefill's sampled tokens
EOS = 2
NUM_DRAFT = 4  # the root and three draft tokens


def _drafts(first):
    # Each path repeats a new token (60) and the root's own token, counted already.
    return [[60, token, 60] for token in first]


@pytest.fixture
def env(tmp_path, monkeypatch):
    return spec_v2_server(tmp_path, monkeypatch, speculative_num_draft_tokens=NUM_DRAFT)


def _reqs(env, prefix, sampling):
    # min_new_tokens needs the tokenizer (its stop ids).
    return [
        make_req(f"{prefix}{i}", 5 + i, sampling={"temperature": 0.0, **s}, tokenizer=env.tokenizer)
        for i, s in enumerate(sampling)
    ]


class _OneRequest:
    """What SamplingBatchInfo.from_schedule_batch and the orchestrator read of a batch."""

    def __init__(self, req):
        self.reqs, self.device = [req], "cpu"


def _plain(env, sampling, emitted, raw):
    """raw [V] as plain decoding penalises it after the request emitted `emitted`, in order."""
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    batch = _OneRequest(_reqs(env, "plain", [sampling])[0])
    info = SamplingBatchInfo.from_schedule_batch(batch, VOCAB)
    for token in emitted:
        info.penalizer_orchestrator.cumulate_output_tokens(torch.tensor([token]))
    logits = raw.clone().unsqueeze(0)
    info.copy_for_forward().apply_logits_bias(logits)
    # A non-overlap plain server applies the orchestrator itself, in its set's order: the same
    # unless a request combines a scaling penalty with an additive one.
    if not ("repetition_penalty" in sampling and len(sampling) > 1):
        direct = raw.clone().unsqueeze(0)
        info.penalizer_orchestrator.apply(direct)
        torch.testing.assert_close(direct, logits)
    return logits[0]


def _raw(rows, seed=0):
    # Both signs: a scaling penalty divides positive logits and multiplies negative ones.
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed))


def _assert_counted(env, batch, sampling, emitted):
    """The scheduler's counts, as the sampler would apply them now, against plain decoding."""
    raw = _raw(len(emitted), seed=1)
    counted = raw.clone()
    batch.sampling_info.copy_for_forward().apply_logits_bias(counted)
    for b, tokens in enumerate(emitted):
        torch.testing.assert_close(counted[b], _plain(env, sampling[b], tokens, raw[b]), msg=f"request {b}")


def _plan_verify(env, favoured, bonus):
    """The verify's row j of request b favours favoured[b][j] (the next draft token when it is
    drafts[b][j + 1]) and its last row the bonus, by more than any penalty here."""
    env.model.plan = lambda fb: [token for row in favoured for token in row + [bonus]]


def _emitted(env, batch):
    """Every token the requests hold, once the output processor has run on the last step."""
    env.loop.flush()
    return [list(req.output_ids) for req in batch.reqs]


def _prefill(env, reqs, first):
    env.model.plan = lambda fb: first
    return env.loop.prefill(reqs)


def _decode(env, batch):
    env.loop.prepare_decode(batch)


def test_each_verify_row_is_penalised_as_plain_decoding_would(env):
    batch = _prefill(env, _reqs(env, "r", SAMPLING), FIRST)
    _decode(env, batch)  # before the prefill's output is processed, as under overlap
    _assert_counted(env, batch, SAMPLING, [[t] for t in FIRST])

    drafts = _drafts(FIRST)
    env.draft.draft_tokens = drafts
    _plan_verify(env, drafts, bonus=70)
    env.loop.run(batch)
    _, raw, penalised = env.target.seen[-1]

    for b, sampling in enumerate(SAMPLING):
        for i in range(NUM_DRAFT):
            # Row i predicts the token after draft position i: plain output so far is the
            # prefill's token (the root), then the path's first i draft tokens.
            row = b * NUM_DRAFT + i
            want = _plain(env, sampling, [FIRST[b]] + drafts[b][:i], raw[row])
            torch.testing.assert_close(penalised[row], want, msg=f"request {b}, position {i}")
    # min_new_tokens holds EOS down until the output is long enough (request 2: 4 tokens).
    assert [bool(penalised[2 * NUM_DRAFT + i, EOS] == float("-inf")) for i in range(NUM_DRAFT)] == [True] * 3 + [False]
    # Every draft was accepted; the verify left all of them, the bonus too, to be counted.
    assert _emitted(env, batch) == [[FIRST[b]] + drafts[b] + [70] for b in range(len(SAMPLING))]
    _decode(env, batch)
    _assert_counted(env, batch, SAMPLING, [[FIRST[b]] + drafts[b] + [70] for b in range(len(SAMPLING))])


def test_emitted_tokens_are_counted_once_through_filter_merge_and_zero_step_batches(env, monkeypatch):
    reqs = _reqs(env, "r", SAMPLING)
    batch = _prefill(env, reqs, FIRST)
    _decode(env, batch)
    drafts = _drafts(FIRST)
    favoured = [list(row) for row in drafts]
    favoured[1][0] = 90  # request 1 rejects its first draft token: it emits the bonus only
    env.draft.draft_tokens = drafts
    _plan_verify(env, favoured, bonus=70)
    env.loop.run(batch)

    batch.filter_batch(keep_indices=[0, 1, 2, 3])  # request 4 finished
    sampling = SAMPLING[:4] + SAMPLING[:1]
    new = _prefill(env, _reqs(env, "n", SAMPLING[:1]), [44])  # processes the verify's output
    batch.merge_batch(new)
    _decode(env, batch)
    emitted = _emitted(env, batch)
    assert [len(tokens) for tokens in emitted] == [5, 2, 5, 5, 1], "the test needs accept lengths that differ"
    _assert_counted(env, batch, sampling, emitted)

    # Upstream's steps=0 batch (the adaptive state of 0 steps): a one-token verify rooted at
    # the pending token.
    monkeypatch.setenv("SGLANG_SPEC_ZERO_STEP_PLAIN_DECODE", "0")
    env.worker.speculative_num_steps, env.worker.speculative_num_draft_tokens = 0, 1
    emitted = _one_token_step(env, batch, sampling, emitted, 80, "TARGET_VERIFY")

    # The same batch as 0002's plain decode: the regular sampler, with the scheduler's rows.
    monkeypatch.setenv("SGLANG_SPEC_ZERO_STEP_PLAIN_DECODE", "1")
    _one_token_step(env, batch, sampling, emitted, 81, "DECODE")


def _one_token_step(env, batch, sampling, emitted, token, mode):
    """A step of one token a request, run as `mode`: its rows penalised as plain decoding's after
    `emitted`, then `token` counted; returns what each request has emitted since."""
    env.model.plan = lambda fb: [token] * len(emitted)
    env.loop.run(batch)
    forward_batch, raw, penalised = env.target.seen[-1]
    assert forward_batch.forward_mode.name == mode
    for b, tokens in enumerate(emitted):
        torch.testing.assert_close(penalised[b], _plain(env, sampling[b], tokens, raw[b]), msg=f"request {b}")
    _decode(env, batch)
    emitted = _emitted(env, batch)
    assert all(tokens[-1] == token for tokens in emitted)
    _assert_counted(env, batch, sampling, emitted)
    return emitted


# A topk-2 tree: the root's children 1 and 2, then 1 -> 3 -> 5 and 2 -> 4.
TREE = [-1, 0, 0, 1, 2, 3]


def _tree_path(node):
    path = []
    while node > 0:
        path.append(node)
        node = TREE[node]
    return path[::-1]


def test_each_node_of_a_draft_tree_is_penalised_with_its_own_path(env):
    """A topk-2 tree whose branches repeat each other's tokens, which a node must not count
    unless they lie on its own path."""
    batch = _prefill(env, _reqs(env, "r", SAMPLING), FIRST)
    _decode(env, batch)
    env.worker.topk, env.worker.speculative_num_draft_tokens = 2, len(TREE)
    env.pools.kv_pool.use_native_move_kv_cache = True  # the accepted path's KV move, in torch
    env.draft.tree, env.draft.draft_tokens = TREE, [[60, 61, 61, 60, first] for first in FIRST]
    # The target follows the second branch: root -> 2 (61) -> 4 (60), then the bonus 70 (the
    # nodes off that path favour it too, which no draft token there proposes).
    path = {0: 61, 2: 60, 4: 70}
    env.model.plan = lambda fb: [path.get(node, 70) for _ in FIRST for node in range(len(TREE))]
    env.loop.run(batch)
    _, raw, penalised = env.target.seen[-1]

    for b, sampling in enumerate(SAMPLING):
        nodes = [FIRST[b]] + env.draft.draft_tokens[b]
        for node in range(len(TREE)):
            row = b * len(TREE) + node
            emitted = [FIRST[b]] + [nodes[n] for n in _tree_path(node)]
            want = _plain(env, sampling, emitted, raw[row])
            torch.testing.assert_close(penalised[row], want, msg=f"request {b}, node {node}")
    # What the tree accepted (its path moved to the front for the output processor) is counted.
    _decode(env, batch)
    emitted = _emitted(env, batch)
    assert emitted == [[first, 61, 60, 70] for first in FIRST]
    _assert_counted(env, batch, SAMPLING, emitted)
