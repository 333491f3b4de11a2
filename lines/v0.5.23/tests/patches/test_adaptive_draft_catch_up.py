"""The deferred draft catch-up (v0.5.23 line): adaptive spec's plain-decode steps=0 batches give
the draft nothing, and the first step above 0 steps extends target and draft over what it missed.

SGLang 0.5.23's own objects on CPU: a real prefill, the overlap scheduler's loop in its order (the
step before is processed after the next launch, spec_v2_cpu.OverlapLoop), EAGLEWorkerV2's own
forward_batch_generation, and the draft's prefill extend (EagleDraftWorker._draft_extend_for_prefill)
down to the forward batch its model would run. The two models' forwards are stood in for: the
target's logits are planned by the test and its captured hidden states name their row; the draft
model records what it was given.
"""

from __future__ import annotations

import torch
from draft_catch_up_cpu import CatchUpServer, catch_up_server

OFF = 4  # plain-decode steps at steps=0
NUM_REQS = 3


def _run_off(server: CatchUpServer, steps: int = OFF):
    """Prefill NUM_REQS requests, then `steps` steps at steps=0; returns the batch."""
    batch = server.prefill(NUM_REQS)
    server.set_steps(0)
    for _ in range(steps):
        server.step(batch)
    return batch


def test_zero_step_decodes_give_the_draft_nothing_and_count_its_debt(tmp_path, monkeypatch):
    server = catch_up_server(tmp_path, monkeypatch)
    batch = _run_off(server)

    modes = [fb.forward_mode.name for fb in server.target_forwards()[1:]]
    assert modes == ["DECODE"] * OFF, "steps=0 batches run as plain decodes by default"
    assert server.draft.decode_extends == 0 and server.draft.model.forwards[1:] == []
    assert server.worker.draft_catch_up.behind == {r.rid: OFF for r in batch.reqs}


def test_the_first_step_above_zero_extends_target_and_draft_over_the_missed_positions(tmp_path, monkeypatch):
    server = catch_up_server(tmp_path, monkeypatch)
    batch = _run_off(server)
    prompt = [len(r.origin_input_ids) for r in batch.reqs]
    slots = [fb.out_cache_loc.tolist() for fb in server.target_forwards()[1:]]
    r2t = batch.req_to_token_pool.req_to_token
    reserved = r2t[batch.req_pool_indices, torch.tensor(prompt) + OFF].tolist()

    server.set_steps(3)
    result = server.step(batch)

    ext = server.target_forwards()[-1]
    assert ext.forward_mode.name == "EXTEND"
    assert ext.extend_prefix_lens_cpu == prompt and ext.extend_seq_lens_cpu == [OFF + 1] * NUM_REQS
    rows = ext.input_ids.view(NUM_REQS, OFF + 1).tolist()
    # Position prompt + j holds the token fed at off step j + 1: the prefill's, then each sample.
    assert rows == [server.tokens_fed(i, OFF + 1) for i in range(NUM_REQS)]
    assert ext.positions.view(NUM_REQS, OFF + 1).tolist() == [list(range(p, p + OFF + 1)) for p in prompt]
    # The KV slots are those the off steps wrote, and the one reserved for the pending token.
    written = [[step[i] for step in slots] + [reserved[i]] for i in range(NUM_REQS)]
    assert ext.out_cache_loc.view(NUM_REQS, OFF + 1).tolist() == written
    assert ext.seq_lens.tolist() == [p + OFF + 1 for p in prompt]

    draft = server.draft.model.forwards[-1]
    assert draft.forward_mode.name == "EXTEND"
    sampled = server.sampled[-1]
    # The draft reads each position's next token, ending with the one this step sampled, and
    # the target's hidden state of that position from this step's forward.
    assert draft.input_ids.view(NUM_REQS, OFF + 1).tolist() == [r[1:] + [sampled[i]] for i, r in enumerate(rows)]
    assert draft.out_cache_loc.tolist() == ext.out_cache_loc.tolist()
    assert draft.hidden[:, 0].tolist() == server.target_hidden_rows(len(server.target_forwards()) - 1)

    assert result.accept_lens.tolist() == [1] * NUM_REQS and result.speculative_num_draft_tokens == 1
    assert result.next_token_ids.tolist() == sampled
    assert result.new_seq_lens.tolist() == [p + OFF + 1 for p in prompt]
    assert result.next_draft_input.topk_index[:, 0].tolist() == server.draft.model.proposals(NUM_REQS)
    assert server.worker.draft_catch_up.behind == {}


def test_after_the_catch_up_the_batch_drafts_and_verifies(tmp_path, monkeypatch):
    server = catch_up_server(tmp_path, monkeypatch)
    batch = _run_off(server)
    server.set_steps(3)
    server.step(batch)  # the catch-up
    server.step(batch)
    assert server.target_forwards()[-1].forward_mode.name == "TARGET_VERIFY"
    assert server.draft.drafts == 1
    server.loop.flush()
    # Every request holds its prefill token, one token for each off step and the catch-up,
    # and what the verify accepted: the stream a server that never skipped the draft gives.
    for i, req in enumerate(batch.reqs):
        assert list(req.output_ids[: OFF + 2]) == server.tokens_fed(i, OFF + 2)


def test_past_its_token_budget_the_catch_up_takes_the_last_positions(tmp_path, monkeypatch):
    server = catch_up_server(tmp_path, monkeypatch)
    batch = _run_off(server, steps=6)
    prompt = [len(r.origin_input_ids) for r in batch.reqs]
    server.worker.draft_catch_up.max_tokens = 3 * NUM_REQS  # 3 rows a request
    server.set_steps(3)
    server.step(batch)

    ext = server.target_forwards()[-1]
    assert ext.extend_seq_lens_cpu == [3] * NUM_REQS
    assert ext.extend_prefix_lens_cpu == [p + 6 - 2 for p in prompt]
    assert ext.input_ids.view(NUM_REQS, 3).tolist() == [server.tokens_fed(i, 7)[-3:] for i in range(NUM_REQS)]


def test_a_request_prefilled_while_off_owes_only_what_it_missed(tmp_path, monkeypatch):
    server = catch_up_server(tmp_path, monkeypatch)
    batch = _run_off(server, steps=2)
    late = server.prefill(1, prefix="late")
    batch.merge_batch(late)
    server.step(batch)
    server.set_steps(3)
    server.step(batch)

    ext = server.target_forwards()[-1]
    assert ext.extend_seq_lens_cpu == [4, 4, 4, 2]


def test_a_grammar_batch_verifies_and_leaves_the_missed_positions_stale(tmp_path, monkeypatch):
    server = catch_up_server(tmp_path, monkeypatch)
    batch = _run_off(server, steps=2)
    server.set_steps(3)
    batch.has_grammar = True  # its token masks come from the verify
    catch_up = server.worker.draft_catch_up
    assert not catch_up.due(batch, 3)
    assert catch_up.behind == {}, "a verify drafts from its own position on"
    batch.has_grammar = False
    assert not catch_up.due(batch, 3)


def test_upstreams_path_when_the_plain_decode_is_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_SPEC_ZERO_STEP_PLAIN_DECODE", "0")
    server = catch_up_server(tmp_path, monkeypatch)
    _run_off(server, steps=2)
    assert [fb.forward_mode.name for fb in server.target_forwards()[1:]] == ["TARGET_VERIFY"] * 2
    assert server.draft.decode_extends == 2, "upstream's draft extend after every steps=0 verify"
    assert server.worker.draft_catch_up.behind == {}


def test_the_skip_variable_still_leaves_the_draft_stale(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND", "1")
    server = catch_up_server(tmp_path, monkeypatch)
    batch = _run_off(server, steps=2)
    assert server.draft.decode_extends == 0 and server.worker.draft_catch_up.behind == {}
    server.set_steps(3)
    server.step(batch)
    assert server.target_forwards()[-1].forward_mode.name == "TARGET_VERIFY"


def test_a_sliding_window_model_keeps_the_per_step_draft_extend(tmp_path, monkeypatch):
    server = catch_up_server(tmp_path, monkeypatch)
    server.target.model_runner.is_hybrid_swa = True
    _run_off(server, steps=2)
    assert [fb.forward_mode.name for fb in server.target_forwards()[1:]] == ["DECODE"] * 2
    assert server.draft.decode_extends == 2 and server.worker.draft_catch_up.behind == {}


def test_a_request_that_finished_while_off_owes_nothing(tmp_path, monkeypatch):
    server = catch_up_server(tmp_path, monkeypatch)
    batch = _run_off(server, steps=2)
    server.loop.flush()
    left = batch.reqs[1].rid
    batch.filter_batch(keep_indices=[0, 2])  # request 1 finished
    server.step(batch)
    assert set(server.worker.draft_catch_up.behind) == {batch.reqs[0].rid, batch.reqs[1].rid}
    assert left not in server.worker.draft_catch_up.behind
    server.set_steps(3)
    server.step(batch)
    assert server.target_forwards()[-1].extend_seq_lens_cpu == [4, 4]
