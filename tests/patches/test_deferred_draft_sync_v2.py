"""The v2 fallback's draft sync, deferred to the step that turns speculation back on: fallback
steps leave the draft behind, and that step catches it up in one extend.

Real SGLang objects on CPU, run in the overlap loop's order (launch a step, then process the one
before it, then prepare the next), so the host lags the device by a step as it does in a server.
The target's forward is stood in for by one that samples tokens the test chooses and returns
hidden states naming their step and row; the draft's prefill extend is SGLang's own, down to the
forward batch its model would run, and the model's forward is recorded instead of run.
"""

from __future__ import annotations

import logging
import types

import pytest
import torch

from deferred_sync_cpu import DRAFT_HIDDEN, Loop, off_for, speculation_comes_back, v2_worker
from sglang_cpu import init_single_rank_groups
from switch_helpers import NUM_DRAFT_TOKENS as N
from switch_helpers import v2_decode_batch, v2_env


@pytest.fixture
def env(tmp_path, monkeypatch):
    pools = v2_env(
        tmp_path,
        monkeypatch,
        speculative_disable_batch_size=2,
        speculative_enable_batch_size=1,
    )
    # A CUDA caching-allocator hint; CPU tensors have no streams to record.
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    init_single_rank_groups()  # ForwardBatch.init_new asks the expert-parallel group's size
    return pools


def test_off_steps_are_plain_decodes_and_the_draft_is_left_behind(env):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    batch, reqs = v2_decode_batch(env, n=3)
    s0 = batch.seq_lens.tolist()
    worker = v2_worker(env)
    Loop(worker, batch).steps(4)

    target = worker._target_worker
    assert [c.mode for c in target.calls] == [ForwardMode.DECODE] * 4
    assert worker._draft_worker.decode_extends == [] and worker._draft_worker.draft_runner.forwards == []
    stale_from = worker.deferred_draft_sync.stale_from
    assert [stale_from[r.rid] for r in reqs] == s0, "stale from the first off position"
    assert worker.deferred_draft_sync.owes(batch.get_model_worker_batch())
    assert worker.spec_switch.fallback_steps == 4


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_the_step_that_turns_speculation_on_extends_target_and_draft_over_the_off_positions(env, caplog, overlap):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    caplog.set_level(logging.INFO, logger="sglang.srt.speculative.eagle_worker_v2")
    off = 5
    batch, reqs, worker, loop = off_for(env, off, overlap)
    s0 = [len(r.origin_input_ids) for r in reqs]  # the first off position: right after the prompt
    first = [100 + i for i in range(3)]  # the prefill's tokens (v2_decode_batch)
    (result,) = loop.steps(1)

    target, runner = worker._target_worker, worker._draft_worker.draft_runner
    ext = target.calls[-1]
    assert ext.mode == ForwardMode.EXTEND
    assert ext.extend_prefix_lens == s0 and ext.extend_seq_lens == [off + 1] * 3
    # Position s0 + j holds the token fed at off step j + 1: the prefill's, then each step's sample.
    tokens = [[first[i]] + [1000 * j + i for j in range(1, off + 1)] for i in range(3)]
    assert ext.input_ids.view(3, off + 1).tolist() == tokens
    assert ext.positions.view(3, off + 1).tolist() == [list(range(s, s + off + 1)) for s in s0]
    req_to_token = env.req_to_token_pool.req_to_token
    # The KV slots are the ones the off steps wrote, and the one reserved for position s.
    wrote = [[int(target.calls[j].out_cache_loc[i]) for j in range(off)] for i in range(3)]
    reserved = [int(req_to_token[r.req_pool_idx, s0[i] + off]) for i, r in enumerate(reqs)]
    assert ext.out_cache_loc.view(3, off + 1).tolist() == [w + [r] for w, r in zip(wrote, reserved, strict=True)]
    assert ext.seq_lens.tolist() == [s + off + 1 for s in s0]

    ((draft, draft_hidden),) = runner.forwards
    assert draft.forward_mode == ForwardMode.EXTEND
    # The draft reads each position's next token, ending with the one this step sampled...
    shifted = [t[1:] + [int(ext.sampled[i])] for i, t in enumerate(tokens)]
    assert draft.input_ids.view(3, off + 1).tolist() == shifted
    assert torch.equal(draft.positions, ext.positions) and torch.equal(draft.out_cache_loc, ext.out_cache_loc)
    # ...with the target's hidden state of that position, from this step's forward.
    step = target.step
    assert draft_hidden[:, 0].tolist() == [100 * step + r for r in range(3 * (off + 1))]

    assert result.spec_skipped and result.accept_lens.tolist() == [1, 1, 1]
    assert result.next_token_ids[::N].tolist() == ext.sampled.tolist()
    nxt = result.next_draft_input
    assert nxt.verified_id.tolist() == ext.sampled.tolist() and nxt.verified_id.dtype == torch.int32
    assert nxt.new_seq_lens.tolist() == [s + off + 1 for s in s0]
    assert nxt.topk_index.view(-1).tolist() == [7, 8, 9], "the next draft starts from the catch-up's proposals"
    assert nxt.hidden_states.shape == (3, DRAFT_HIDDEN)
    assert not worker.deferred_draft_sync.owes(batch.get_model_worker_batch())
    assert worker.spec_switch.speculating
    assert (worker.spec_switch.fallback_steps, worker.spec_switch.spec_steps) == (off + 1, 0)
    assert "spec-switch: draft caught up over 15 positions of 3 requests" in caplog.text


def test_past_its_token_budget_the_catch_up_takes_the_last_positions(env):
    _, reqs, worker, loop = off_for(env, 6)
    s0 = [len(r.origin_input_ids) for r in reqs]
    worker.deferred_draft_sync.max_catch_up_tokens = 3 * 3  # 3 rows per request
    loop.steps(1)

    ext = worker._target_worker.calls[-1]
    assert ext.extend_seq_lens == [3] * 3
    assert ext.extend_prefix_lens == [s + 6 - 2 for s in s0]
    assert ext.input_ids.view(3, 3).tolist() == [[1000 * j + i for j in (4, 5, 6)] for i in range(3)]


def test_a_request_prefilled_while_off_catches_up_from_its_own_first_off_step(env):
    batch, reqs = v2_decode_batch(env, n=3)
    s0 = batch.seq_lens.tolist()
    worker = v2_worker(env)
    loop = Loop(worker, batch)
    loop.steps(1)
    # Request 2 is prefilled anew (as after a retraction): its draft is current from there.
    worker.deferred_draft_sync.forget(types.SimpleNamespace(reqs=[reqs[2]]))
    loop.steps(3)
    speculation_comes_back(worker)
    loop.steps(1)

    ext = worker._target_worker.calls[-1]
    assert ext.extend_prefix_lens == [s0[0], s0[1], s0[2] + 1]
    assert ext.extend_seq_lens == [5, 5, 4]


def test_a_grammar_batch_verifies_while_behind_and_drops_the_debt(env):
    batch, _, worker, _ = off_for(env, 2)
    mwb = batch.get_model_worker_batch()
    # Grammar batches keep speculating (their state lags a step under overlap).
    mwb.sampling_info.grammars = [object()] * 3

    class Drafted(Exception):
        pass

    def draft(_):
        raise Drafted

    worker._draft_worker.draft = draft
    with pytest.raises(Drafted):
        worker.forward_batch_generation(mwb)
    assert not worker.deferred_draft_sync.owes(mwb), "the verify drafts from its own position on"
    assert worker._target_worker.step == 2, "no catch-up extend ran"


def test_with_mlp_sync_the_catch_up_carries_its_own_token_counts(env):
    # An all-to-all MoE backend (or --moe-dense-tp-size 1) syncs every forward's token counts,
    # which the scheduler sets for the decode it planned; the extend must carry its own, or the
    # model runner pads its rows down to the decode's count (on a GPU: "negative dimension").
    batch, _, worker, loop = off_for(env, 3)
    batch.global_num_tokens, batch.global_num_tokens_for_logprob = [3], [3]
    loop.steps(1)

    ext = worker._target_worker.calls[-1]
    assert ext.global_num_tokens == [sum(ext.extend_seq_lens)] == [3 * 4]
    assert ext.is_extend_in_batch


def test_requests_that_left_owe_nothing_and_a_start_never_passes_s(env):
    batch, reqs = v2_decode_batch(env, n=3)
    worker = v2_worker(env)
    loop = Loop(worker, batch)
    loop.steps(2)
    sync = worker.deferred_draft_sync
    loop.process_waiting()
    batch.filter_batch(keep_indices=[0, 1])  # request 2 finished
    loop.steps(1)
    assert set(sync.stale_from) == {reqs[0].rid, reqs[1].rid}

    sync.stale_from[reqs[0].rid] = int(batch.seq_lens_cpu[0]) + 10  # an entry from nowhere
    mwb = batch.get_model_worker_batch()
    assert sync.catch_up_starts(mwb)[0] == int(mwb.seq_lens_cpu[0])


@pytest.mark.parametrize("model", ["hybrid_swa", "mamba", "mrope"])
def test_models_whose_state_an_extend_would_corrupt_are_refused(model):
    from sglang.srt.speculative.spec_switch_v2 import DeferredDraftSyncV2

    from sglang_cpu import server_args_with_defaults

    runner = types.SimpleNamespace(
        is_hybrid_swa=model == "hybrid_swa",
        mambaish_config=object() if model == "mamba" else None,
        model_is_mrope=model == "mrope",
        model_config=types.SimpleNamespace(hf_config=types.SimpleNamespace(architectures=["SomeModel"])),
    )
    with pytest.raises(ValueError, match=r"catches the draft up .* do not allow \(SomeModel\)"):
        DeferredDraftSyncV2.for_target(server_args_with_defaults(), runner)
    plain = types.SimpleNamespace(
        **{**vars(runner), "is_hybrid_swa": False, "mambaish_config": None, "model_is_mrope": False}
    )
    sync = DeferredDraftSyncV2.for_target(server_args_with_defaults(chunked_prefill_size=2048), plain)
    assert sync.max_catch_up_tokens == 2048


def test_a_catch_up_step_counts_once_and_only_when_speculation_would_run():
    from sglang.srt.speculative.spec_switch import SpecSwitch, StepKind

    switch, asked = SpecSwitch(disable_batch_size=4, enable_batch_size=2), []

    def behind(answer):
        return lambda: asked.append(answer) or answer

    assert switch.decide(5, draft_behind=behind(True)) is StepKind.FALLBACK
    assert asked == [], "an off step does not ask whether the draft is behind"
    assert switch.decide(2, draft_behind=behind(True)) is StepKind.CATCH_UP
    assert switch.decide(2, draft_behind=behind(False)) is StepKind.SPECULATIVE
    assert asked == [True, False]
    assert (switch.spec_steps, switch.fallback_steps, switch.switches) == (1, 2, 2)
    assert switch.speculating, "catching up does not switch speculation off"


@pytest.mark.parametrize("env_v2, refused", [("1", True), ("0", False)])
def test_two_batch_overlap_is_refused_with_the_v2_switch(monkeypatch, env_v2, refused):
    from sglang_cpu import server_args_with_defaults

    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", env_v2)
    args = server_args_with_defaults()
    args.speculative_algorithm = "EAGLE3"
    args.speculative_disable_batch_size = 8
    args.enable_two_batch_overlap = True
    if refused:
        with pytest.raises(ValueError, match="does not support --enable-two-batch-overlap"):
            args._handle_speculative_switch()
    else:
        args._handle_speculative_switch()  # v1 catches nothing up: its fallback syncs every step
