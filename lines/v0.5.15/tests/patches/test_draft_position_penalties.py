"""Penalties under speculation (v0.5.15 line): each verify row penalised as plain decoding would,
every emitted token counted once before the next step samples.

SGLang 0.5.15's own objects on CPU: a real prefill, the overlap scheduler's bookkeeping in its order
(spec_v2_cpu.OverlapLoop), EAGLEWorkerV2.forward_batch_generation and verify, filter and merge,
steps=0 batches as upstream's one-token verify and as the plain decode of this line's 0002. The
models are stood in for (their logits are the test's), and the native greedy tree walk runs as a
torch reference. The reference for every penalty is SGLang's own plain-decode path, one request at
a time: `cumulate_output_tokens` once per token, then the penalties applied as the scheduler's
forward copy applies them (additive, then scaling: a non-overlap server applies its penalizers in
the iteration order of a set of classes, which differs between processes).
"""

from __future__ import annotations

import pytest
import torch
from launches import LaunchedOps
from spec_v2_cpu import spec_v2_server

from sglang_cpu import VOCAB, make_req

EOS = 2
SAMPLING = [
    {"frequency_penalty": 0.7},
    {"presence_penalty": 0.9},
    {"frequency_penalty": 0.3, "presence_penalty": 0.5, "min_new_tokens": 3},
    {"repetition_penalty": 1.3},
    {"repetition_penalty": 1.2, "frequency_penalty": 0.4},
    {},  # no penalty, in the same batch
]
FIRST = [30, 31, 30, 33, 30, 35]  # the prefill's sampled tokens
CHAIN = [60, 30, 60]  # the draft after the root: a token repeated, one the prefill emitted
REJECTED = 1  # this request drafts REJECTED_CHAIN, rejected at its first token
REJECTED_CHAIN = [90, 91, 92]
NEW_SAMPLING = [{"frequency_penalty": 0.5, "repetition_penalty": 1.1}]  # a later prefill
NEW_FIRST = [44]


@pytest.fixture
def env(tmp_path, monkeypatch):
    return spec_v2_server(tmp_path, monkeypatch)


def _reqs(env, prefix, sampling):
    return [
        make_req(f"{prefix}{i}", 5 + i, sampling={"temperature": 0.0, **s}, tokenizer=env.tokenizer)
        for i, s in enumerate(sampling)
    ]


def _plain(env, sampling, emitted, rows):
    """rows [n, V] as plain decoding penalises them after the request emitted `emitted`."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    pools = env.pools
    (req,) = _reqs(env, "plain", [sampling])
    batch = ScheduleBatch.init_new([req], pools.req_to_token_pool, pools.allocator, pools.tree_cache,
                                   pools.model_config, enable_overlap=False, spec_algorithm=SpeculativeAlgorithm.NONE)  # fmt: skip
    info = SamplingBatchInfo.from_schedule_batch(batch, VOCAB)
    for token in emitted:
        info.penalizer_orchestrator.cumulate_output_tokens(torch.tensor([token]))
    out = rows.clone()
    for row in out:
        info.copy_for_forward().apply_logits_bias(row.unsqueeze(0))
    return out


def _counted(batch, rows):
    """rows [bs, V] as the batch's next sampling penalises them (its forward copy)."""
    out = rows.clone()
    batch.sampling_info.copy_for_forward().apply_logits_bias(out)
    return out


def _check_counts(env, batch, sampling, emitted):
    rows = torch.rand(len(sampling), VOCAB, generator=torch.Generator().manual_seed(7)) - 0.5
    expected = torch.cat(
        [_plain(env, s, e, rows[b : b + 1]) for b, (s, e) in enumerate(zip(sampling, emitted, strict=True))]
    )
    torch.testing.assert_close(_counted(batch, rows), expected)


def _chain(b):
    return CHAIN if b != REJECTED else REJECTED_CHAIN


def _chain_plan(reqs):
    """Each request drafts CHAIN after its pending token; the target agrees but for REJECTED."""
    return [_chain(b) for b in range(len(reqs))]


def _verify_rows_as_plain(env, sampling, emitted, num_draft, paths):
    """The last verify's penalised rows against plain decoding after emitted + each row's path."""
    _, raw, logits = env.target.seen[-1]
    for b, s in enumerate(sampling):
        for i in range(num_draft):
            row = b * num_draft + i
            expected = _plain(env, s, emitted[b] + paths[b][:i], raw[row : row + 1])
            torch.testing.assert_close(logits[row : row + 1], expected, msg=f"request {b}, draft position {i}")


def test_verify_penalises_each_draft_position_as_plain_decoding_would(env):
    loop, model, reqs = env.loop, env.model, _reqs(env, "r", SAMPLING)
    model.plan = lambda fb: FIRST
    batch = loop.prefill(reqs)
    loop.prepare_decode(batch)
    _check_counts(env, batch, SAMPLING, [[t] for t in FIRST])

    env.draft.draft_tokens = _chain_plan(reqs)
    num_draft = len(CHAIN) + 1
    # Row i predicts the token after draft position i: CHAIN[i], then the bonus 70.
    model.plan = lambda fb: [t for b in range(len(reqs)) for t in (CHAIN + [70] if b != REJECTED else [80] * num_draft)]
    result = loop.run(batch)

    _verify_rows_as_plain(env, SAMPLING, [[t] for t in FIRST], num_draft, [_chain(b) for b in range(len(reqs))])
    # min_new_tokens holds the EOS down until the output is long enough (request 2: 3 tokens).
    logits = env.target.seen[-1][2]
    assert [bool(logits[2 * num_draft + i, EOS] == float("-inf")) for i in range(num_draft)] == [
        True,
        True,
        False,
        False,
    ]
    # The test means something: the rows of one request differ where their paths do.
    raw = env.target.seen[-1][1]
    assert not torch.allclose(logits[0] - raw[0], logits[num_draft - 1] - raw[num_draft - 1])
    assert result.accept_lens.tolist() == [4 if b != REJECTED else 1 for b in range(len(reqs))]


def test_emitted_tokens_are_counted_once_through_filter_merge_and_zero_step_batches(env, monkeypatch):
    loop, model, worker = env.loop, env.model, env.worker
    reqs = _reqs(env, "r", SAMPLING)
    model.plan = lambda fb: FIRST
    batch = loop.prefill(reqs)
    emitted = [[t] for t in FIRST]

    # A speculative step; the other requests accept the whole chain, REJECTED its bonus only.
    loop.prepare_decode(batch)
    env.draft.draft_tokens = _chain_plan(reqs)
    model.plan = lambda fb: [t for b in range(len(reqs)) for t in (CHAIN + [70] if b != REJECTED else [80] * 4)]
    loop.run(batch)  # and, after its launch, the prefill's output
    emitted = [e + (CHAIN + [70] if b != REJECTED else [80]) for b, e in enumerate(emitted)]

    # A new prefill runs while the decode batch waits; then merge, and request 3 leaves.
    new_reqs = _reqs(env, "n", NEW_SAMPLING)
    model.plan = lambda fb: NEW_FIRST
    new = loop.prefill(new_reqs)  # and the speculative step's output
    batch.merge_batch(new)
    keep = [0, 1, 2, 4, 5, 6]
    batch.filter_batch(keep_indices=keep)
    sampling = [(SAMPLING + NEW_SAMPLING)[i] for i in keep]
    emitted = [(emitted + [[t] for t in NEW_FIRST])[i] for i in keep]
    loop.prepare_decode(batch)
    _check_counts(env, batch, sampling, emitted)
    assert batch.spec_info.accepted_ids is None  # counted once

    # Upstream's steps=0: a one-token verify.
    monkeypatch.setenv("SGLANG_SPEC_ZERO_STEP_PLAIN_DECODE", "0")
    worker.speculative_num_steps, worker.speculative_num_draft_tokens = 0, 1
    steps0 = [50 + b for b in range(len(keep))]
    model.plan = lambda fb: steps0
    loop.run(batch)  # and the new prefill's output
    assert env.target.seen[-1][0].forward_mode.is_target_verify()
    _verify_rows_as_plain(env, sampling, emitted, 1, [[]] * len(keep))
    emitted = [e + [t] for e, t in zip(emitted, steps0, strict=True)]
    loop.prepare_decode(batch)
    _check_counts(env, batch, sampling, emitted)

    # The line's plain decode at steps=0: the regular sampler, with the penalties of the forward
    # copy the scheduler made after counting the last step.
    monkeypatch.setenv("SGLANG_SPEC_ZERO_STEP_PLAIN_DECODE", "1")
    plain = [70 + b for b in range(len(keep))]
    model.plan = lambda fb: plain
    result = loop.run(batch)  # and the steps=0 batch's output
    forward_batch, raw, logits = env.target.seen[-1]
    assert forward_batch.forward_mode.is_decode() and forward_batch.spec_info is None
    for b, s in enumerate(sampling):
        torch.testing.assert_close(logits[b : b + 1], _plain(env, s, emitted[b], raw[b : b + 1]))
    assert result.next_token_ids.tolist() == plain
    emitted = [e + [t] for e, t in zip(emitted, plain, strict=True)]
    loop.prepare_decode(batch)
    _check_counts(env, batch, sampling, emitted)
    loop.flush()
    assert [list(req.output_ids) for req in batch.reqs] == emitted


def test_a_batch_that_penalises_nothing_merges_with_one_that_does(env):
    """A side whose forward copy penalised nothing leaves no tokens: the merge pads it."""
    loop, model = env.loop, env.model
    none, penalised = [{}], [{"frequency_penalty": 0.7, "min_new_tokens": 3}]
    model.plan = lambda fb: [40]
    batch = loop.prefill(_reqs(env, "a", none))
    loop.prepare_decode(batch)
    env.draft.draft_tokens = [CHAIN]
    model.plan = lambda fb: CHAIN + [70]
    loop.run(batch)  # and the prefill's output

    model.plan = lambda fb: [41]
    new = loop.prefill(_reqs(env, "b", penalised))  # and the step's output
    batch.merge_batch(new)  # the running side carries nothing
    loop.prepare_decode(batch)
    _check_counts(env, batch, none + penalised, [[40] + CHAIN + [70], [41]])

    env.draft.draft_tokens = [CHAIN] * 2
    model.plan = lambda fb: (CHAIN + [70]) * 2
    loop.run(batch)  # and the second prefill's output
    model.plan = lambda fb: [42]
    new = loop.prefill(_reqs(env, "c", none))  # and the step's output
    batch.merge_batch(new)  # the new side carries nothing
    loop.prepare_decode(batch)
    emitted = [[40] + CHAIN + [70] + CHAIN + [70], [41] + CHAIN + [70], [42]]
    _check_counts(env, batch, none + penalised + none, emitted)


@pytest.mark.parametrize("penalised", [True, False], ids=["penalties", "none"])
def test_a_verify_builds_the_emitted_ids_only_when_something_penalises(env, penalised):
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.spec_penalties import accepted_token_ids, carry_accepted_tokens

    sampling = SAMPLING if penalised else [{}] * len(SAMPLING)
    env.model.plan = lambda fb: FIRST
    batch = env.loop.prefill(_reqs(env, "r", sampling))
    env.loop.prepare_decode(batch)
    info = batch.sampling_info.copy_for_forward()  # what the verify samples with
    # Request b accepted b % 4 drafts, then the bonus.
    accept_tokens = torch.tensor([[t, *CHAIN] for t in FIRST], dtype=torch.int32)
    accept_index = torch.tensor([[4 * b + i if i <= b % 4 else -1 for i in range(4)] for b in range(len(FIRST))])
    next_input = EagleDraftInput(bonus_tokens=accept_tokens[:, 0])
    with LaunchedOps() as launched:
        carry_accepted_tokens(next_input, accept_tokens, accept_index, info)

    if penalised:
        torch.testing.assert_close(next_input.accepted_ids, accepted_token_ids(accept_tokens, accept_index))
    else:
        # Every verify of an unpenalised batch would pay these launches for nothing.
        assert launched.ops == []
        assert getattr(next_input, "accepted_ids", None) is None


TREE_PARENT = [-1, 0, 0, 1, 1, 2]  # topk 2: root 0 -> 1, 2; 1 -> 3, 4; 2 -> 5
TREE = [60, 61, 60, 30, 62]  # after the root; 60 repeats along 0 -> 1 -> 3, 30 was emitted


def _tree_path(node):
    path = []
    while node != 0:
        path.append(node)
        node = TREE_PARENT[node]
    return path[::-1]


def test_each_tree_node_is_penalised_with_its_own_path(tmp_path, monkeypatch):
    """topk > 1: the verify of a two-way tree, its rows against each node's own path."""
    env = spec_v2_server(tmp_path, monkeypatch, speculative_eagle_topk=2, speculative_num_steps=2,
                         speculative_num_draft_tokens=len(TREE) + 1)  # fmt: skip
    # The accepted path's KV moves to the front on SGLang's torch path, not its triton copy.
    monkeypatch.setenv("SGLANG_NATIVE_MOVE_KV_CACHE", "1")
    loop, model, reqs = env.loop, env.model, _reqs(env, "r", SAMPLING)
    model.plan = lambda fb: FIRST
    batch = loop.prefill(reqs)
    loop.prepare_decode(batch)

    env.draft.tree, env.draft.draft_tokens = TREE_PARENT, [TREE] * len(reqs)
    num_draft = len(TREE) + 1
    # The target takes the path 0 -> 2 -> 5 (60, 62), then the bonus 70.
    plan = {0: TREE[1], 2: TREE[4]}
    model.plan = lambda fb: [plan.get(i, 70) for _ in reqs for i in range(num_draft)]
    result = loop.run(batch)  # and the prefill's output

    _, raw, logits = env.target.seen[-1]
    for b, s in enumerate(SAMPLING):
        for i in range(num_draft):
            row = b * num_draft + i
            path = [TREE[a - 1] for a in _tree_path(i)]
            expected = _plain(env, s, [FIRST[b]] + path, raw[row : row + 1])
            torch.testing.assert_close(logits[row : row + 1], expected, msg=f"request {b}, node {i}")
    assert result.accept_lens.tolist() == [3] * len(reqs)
    loop.prepare_decode(batch)
    _check_counts(env, batch, SAMPLING, [[FIRST[b], TREE[1], TREE[4], 70] for b in range(len(reqs))])
