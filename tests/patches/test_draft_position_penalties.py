"""Penalties per draft position (0012): each verify row is penalised as plain decoding would have
penalised it, had the draft tokens on its path been accepted one step at a time.

The orchestrator is SGLang's own, built from a real prefilled batch with frequency, presence and
min_new_tokens requests; the reference for each row is SGLang's own plain-decode path on a copy of
it: `cumulate_output_tokens` once per path token, then `apply`.
"""

from __future__ import annotations

import copy

import pytest
import torch
from verify_cpu import word_tokenizer

from sglang_cpu import VOCAB, make_pools, make_req, make_server_args, prefilled_decode_batch, write_tiny_llama_config

EARLIER_OUTPUT = [30, 31, 30]  # tokens the requests emitted before this step
SAMPLING = [
    {"frequency_penalty": 0.7},
    {"presence_penalty": 0.9},
    {"frequency_penalty": 0.3, "presence_penalty": 0.5, "min_new_tokens": 6},
    {},  # no penalty, in the same batch
]
# A v1 tree (topk 2): root 0 -> 1, 2; 1 -> 3, 4; 2 -> 5. Token 50 repeats along 0 -> 1 -> 3.
TREE = ([1, 3, 5, -1, -1, -1], [-1, 2, -1, 4, -1, -1], [50, 51, 50, 52, 2])
# A v2 chain (topk 1): root -> 1 -> 2 -> 3, with the EOS and a repeated token.
CHAIN = ([1, 2, 3, -1], [-1, -1, -1, -1], [60, 60, 2])
PATHS = {"tree": TREE, "chain": CHAIN}


@pytest.fixture
def orchestrator(tmp_path):
    model_path = write_tiny_llama_config(tmp_path / "model")
    server_args = make_server_args(model_path, speculative_eagle_topk=2, speculative_num_draft_tokens=6)
    pools = make_pools(server_args)
    tokenizer = word_tokenizer(tmp_path / "tokenizer")
    reqs = [make_req(f"r{i}", 5 + i, sampling={"temperature": 0.0, **s}) for i, s in enumerate(SAMPLING)]
    for req in reqs:
        req.tokenizer = tokenizer
    roots = [100 + i for i in range(len(reqs))]
    batch = prefilled_decode_batch(pools, reqs, roots, topk=2)
    orch = batch.sampling_info.penalizer_orchestrator
    assert orch.is_required
    # The output so far, through the root, as the v1 worker counts it before drafting.
    for token in EARLIER_OUTPUT + [None]:
        ids = torch.tensor(roots) if token is None else torch.full((len(reqs),), token)
        orch.cumulate_output_tokens(ids)
    # The orchestrator holds its batch by weak reference.
    return orch, roots, batch


def _tree(kind, roots):
    next_token, next_sibling, tokens = PATHS[kind]
    bs = len(roots)
    draft = torch.tensor([[root] + tokens for root in roots])
    return (draft, torch.tensor([next_token] * bs), torch.tensor([next_sibling] * bs))


def _path(next_token, next_sibling, node):
    parent = {}
    for p, c in enumerate(next_token):
        while c != -1:
            parent[c] = p
            c = next_sibling[c]
    path = []
    while node != 0:
        path.append(node)
        node = parent[node]
    return path[::-1]


def _plain_row(orch, b, path_tokens, row):
    ref = copy.deepcopy(orch)
    for token in path_tokens:
        ref.cumulate_output_tokens(torch.full((len(orch.reqs()),), token))
    logits = row.expand(len(orch.reqs()), -1).clone()
    ref.apply(logits)
    return logits[b]


@pytest.mark.parametrize("kind", PATHS)
def test_each_row_is_penalised_as_plain_decoding_would(orchestrator, kind):
    from sglang.srt.speculative.spec_penalties import apply_penalties_per_draft_position

    orch, roots, _ = orchestrator
    draft, next_token, next_sibling = _tree(kind, roots)
    bs, num_draft = draft.shape
    logits = torch.rand(bs * num_draft, VOCAB, generator=torch.Generator().manual_seed(1))
    expected = torch.stack(
        [
            _plain_row(
                orch, b, [int(draft[b, a]) for a in _path(PATHS[kind][0], PATHS[kind][1], i)], logits[b * num_draft + i]
            )
            for b in range(bs)
            for i in range(num_draft)
        ]
    )

    apply_penalties_per_draft_position(logits, orch, draft, next_token, next_sibling)

    torch.testing.assert_close(logits, expected)
    # The test means something: rows of one request differ where their paths do.
    assert not torch.equal(expected[0], expected[num_draft - 1])


def test_accepted_tokens_count_as_that_many_plain_steps(orchestrator):
    from sglang.srt.speculative.spec_penalties import cumulate_accepted_tokens

    orch, _, _ = orchestrator
    accepted = [[40, 41, 40], [42], [], [43, 43]]
    ids = torch.tensor([row + [-1] * (3 - len(row)) for row in accepted])
    plain = copy.deepcopy(orch)
    for j in range(3):
        # One plain step for the requests that accepted a j-th token: the others' rows are put back.
        before = copy.deepcopy(plain)
        plain.cumulate_output_tokens(ids[:, j].clamp(min=0))
        for b, row in enumerate(accepted):
            if j >= len(row):
                _restore_row(plain, before, b)

    # Where nothing was accepted verify's predict buffer holds whatever was in memory (on the
    # H200 an index past the vocabulary, a device-side assert): only the mask may decide.
    garbage = torch.where(ids >= 0, ids, torch.tensor([[VOCAB + 7, -(2**31), 10**9]]))
    cumulate_accepted_tokens(orch, garbage, ids >= 0)

    for penalizer, mine in zip(plain.penalizers.values(), orch.penalizers.values(), strict=True):
        for name in ("cumulated_frequency_penalties", "cumulated_presence_penalties", "len_output_tokens"):
            if hasattr(penalizer, name):
                torch.testing.assert_close(getattr(mine, name), getattr(penalizer, name))


def _restore_row(orch, before, b):
    for penalizer, old in zip(orch.penalizers.values(), before.penalizers.values(), strict=True):
        for name in ("cumulated_frequency_penalties", "cumulated_presence_penalties", "len_output_tokens"):
            if hasattr(penalizer, name):
                getattr(penalizer, name)[b] = getattr(old, name)[b]
