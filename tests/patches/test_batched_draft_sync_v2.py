"""The v2 fallback's batched draft sync (--speculative-fallback-batched-draft-sync).

Real SGLang objects on CPU. The target's forward is stood in for by one that samples the tokens
the test chooses and returns a hidden state that names its step and request; the draft extend,
which needs the GPU, is recorded instead of run.
"""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

from switch_helpers import NUM_DRAFT_TOKENS as N
from switch_helpers import scheduler_for_output_processing, v2_decode_batch, v2_env

AUX_HIDDEN = 12  # the target's captured hidden state width (EAGLE-3: three layers)


@pytest.fixture
def env(tmp_path, monkeypatch):
    pools = v2_env(
        tmp_path,
        monkeypatch,
        speculative_disable_batch_size=2,
        speculative_enable_batch_size=1,
        speculative_fallback_batched_draft_sync=True,
    )
    # A CUDA caching-allocator hint; CPU tensors have no streams to record.
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    return pools


def _hidden(step, i):
    return float(100 * step + i)


class _Target:
    """Samples token 1000 * step + i for request i; its hidden states name (step, request)."""

    def __init__(self):
        self.step = 0
        self.sampled = []
        self.target_slots = []  # the KV slot each step's target wrote, per request

    def forward_batch_generation(self, mwb):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult

        self.step += 1
        bs = len(mwb.seq_lens)
        tokens = torch.tensor([1000 * self.step + i for i in range(bs)], dtype=torch.int64)
        hidden = torch.stack([torch.full((AUX_HIDDEN,), _hidden(self.step, i)) for i in range(bs)])
        self.sampled.append(tokens)
        self.target_slots.append(mwb.out_cache_loc.clone())
        return GenerationBatchResult(
            logits_output=LogitsProcessorOutput(next_token_logits=None, hidden_states=hidden),
            next_token_ids=tokens,
        )


class _Draft:
    """Records each draft extend's inputs and leaves proposals, as _draft_extend_for_decode does."""

    def __init__(self):
        self.extends = []
        self.draft_runner = types.SimpleNamespace(tp_group=None)

    def draft_tp_context(self, group):
        return contextlib.nullcontext()

    def _draft_extend_for_decode(self, mwb, result):
        self.extends.append(types.SimpleNamespace(
            seq_lens=mwb.seq_lens.clone(),
            seq_lens_cpu=mwb.seq_lens_cpu.clone(),
            seq_lens_sum=mwb.seq_lens_sum,
            out_cache_loc=mwb.out_cache_loc.clone(),
            token_ids=result.next_token_ids.clone(),
            hidden=result.logits_output.hidden_states.clone(),
            accept_lens=result.accept_lens.clone(),
        ))
        bs = len(mwb.seq_lens)
        nxt = result.next_draft_input
        nxt.topk_p, nxt.topk_index = torch.ones(bs, 1), torch.full((bs, 1), len(self.extends))
        nxt.hidden_states = torch.zeros(bs, 8)


def _worker(env, batch):
    from sglang.srt.server_args import get_global_server_args
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
    from sglang.srt.speculative.spec_switch import SpecSwitch
    from sglang.srt.speculative.spec_switch_v2 import BatchedDraftSyncV2

    w = object.__new__(EAGLEWorkerV2)
    args = get_global_server_args()
    w.server_args = args
    w.speculative_num_draft_tokens = N
    w.device = "cpu"
    w.req_to_token_pool = batch.req_to_token_pool
    w._target_worker, w._draft_worker = _Target(), _Draft()
    w.spec_switch = SpecSwitch.from_server_args(args)
    num_slots = batch.req_to_token_pool.req_to_token.shape[0]
    w.batched_draft_sync = BatchedDraftSyncV2(N, num_slots, "cpu")
    return w


def _decode_steps(worker, batch, steps):
    """Fallback steps in the overlap loop's order: launch, next batch, process the result."""
    scheduler, entries = scheduler_for_output_processing(), []
    for _ in range(steps):
        mwb = batch.get_model_worker_batch()
        entries.append((mwb.seq_lens.clone(), mwb.req_pool_indices.clone()))
        result = worker.forward_batch_generation(mwb)
        batch.spec_info = result.next_draft_input
        batch.seq_lens = result.next_draft_input.new_seq_lens
        scheduler._resolve_spec_overlap_token_ids(result, batch)
        batch.prepare_for_decode()
    return entries


def test_the_draft_gets_n_steps_of_rows_in_one_extend(env):
    batch, _ = v2_decode_batch(env, n=3)
    worker = _worker(env, batch)
    entries = _decode_steps(worker, batch, steps=2 * N)
    extends = worker._draft_worker.extends

    assert worker.spec_switch.fallback_steps == 2 * N
    assert len(extends) == 2, "one sync per N fallback steps"
    req_to_token = batch.req_to_token_pool.req_to_token
    for k, ext in enumerate(extends):
        first = k * N  # the window's first step (0-based)
        s_first, slots = entries[first]
        # Row j is position s_first + j: the token step first + j sampled there, with the
        # target's hidden state of that position, as after a verify that accepted N tokens.
        assert ext.accept_lens.tolist() == [N] * 3
        assert torch.equal(ext.seq_lens, s_first) and torch.equal(ext.seq_lens_cpu, s_first)
        assert ext.seq_lens_sum == int(s_first.sum())
        sampled = worker._target_worker.sampled
        assert ext.token_ids.view(3, N).tolist() == [
            [int(sampled[first + j][i]) for j in range(N)] for i in range(3)
        ]
        assert ext.hidden.view(3, N, AUX_HIDDEN)[:, :, 0].tolist() == [
            [_hidden(first + j + 1, i) for j in range(N)] for i in range(3)
        ]
        # The draft writes its KV where the target wrote these positions' KV.
        target_slots = worker._target_worker.target_slots
        assert ext.out_cache_loc.view(3, N).tolist() == [
            [int(target_slots[first + j][i]) for j in range(N)] for i in range(3)
        ]
        assert ext.out_cache_loc.tolist() == [
            int(req_to_token[slots[i], int(s_first[i]) + j]) for i in range(3) for j in range(N)
        ]


def test_speculation_waits_one_step_for_the_rows_it_is_owed(env):
    batch, _ = v2_decode_batch(env, n=3)
    worker = _worker(env, batch)
    _decode_steps(worker, batch, steps=N + 1)  # one sync, then one row owed
    assert len(worker._draft_worker.extends) == 1
    assert worker.batched_draft_sync.owes(batch.get_model_worker_batch())

    worker.spec_switch.enable_batch_size = worker.spec_switch.disable_batch_size = 3  # load falls
    entries = _decode_steps(worker, batch, steps=1)

    ext = worker._draft_worker.extends[-1]
    assert ext.accept_lens.tolist() == [2, 2, 2], "the owed row and this step's"
    assert torch.equal(ext.seq_lens, entries[0][0] - 1)
    assert worker.spec_switch.speculating
    assert worker.spec_switch.fallback_steps == N + 2 and worker.spec_switch.spec_steps == 0
    assert not worker.batched_draft_sync.owes(batch.get_model_worker_batch())


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


def test_a_request_that_joined_later_owes_fewer_rows(env):
    batch, reqs = v2_decode_batch(env, n=3)
    worker = _worker(env, batch)
    _decode_steps(worker, batch, steps=1)
    # Request 2 is prefilled anew (as after a retraction): its draft is in sync from there.
    worker.batched_draft_sync.forget(types.SimpleNamespace(
        reqs=[reqs[2]], req_pool_indices=batch.req_pool_indices[2:3]))
    entries = _decode_steps(worker, batch, steps=N - 1)

    (ext,) = worker._draft_worker.extends
    assert ext.accept_lens.tolist() == [N, N, N - 1]
    s_now = entries[-1][0]
    # Rows end at this step's position; request 2's began one step later.
    assert ext.seq_lens.tolist() == [int(s_now[i]) - N + 1 + (i == 2) for i in range(3)]
    sampled = worker._target_worker.sampled
    assert ext.token_ids.view(3, N)[2, : N - 1].tolist() == [int(sampled[j][2]) for j in range(1, N)]


def test_without_the_flag_every_fallback_step_syncs_one_row(env):
    from sglang.srt.server_args import get_global_server_args

    get_global_server_args().speculative_fallback_batched_draft_sync = False
    batch, _ = v2_decode_batch(env, n=3)
    worker = _worker(env, batch)
    worker.batched_draft_sync = None
    entries = _decode_steps(worker, batch, steps=2)

    extends = worker._draft_worker.extends
    assert len(extends) == 2
    for (s, _), ext in zip(entries, extends, strict=False):
        assert ext.accept_lens.tolist() == [1, 1, 1]
        assert torch.equal(ext.seq_lens, s)
        assert ext.hidden.view(3, N, AUX_HIDDEN)[:, :, 0].tolist() == [
            [ext.hidden.view(3, N, AUX_HIDDEN)[i, 0, 0].item()] * N for i in range(3)
        ]


@pytest.mark.parametrize(
    "flags, env_v2, message",
    [
        ({"speculative_fallback_skip_draft_sync": True}, "1", "give one of them"),
        ({}, "0", "set SGLANG_ENABLE_SPEC_V2=1"),
    ],
)
def test_refused_where_it_cannot_act(tmp_path, monkeypatch, flags, env_v2, message):
    from sglang_cpu import server_args_with_defaults

    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", env_v2)
    args = server_args_with_defaults()
    args.speculative_algorithm = "EAGLE3"
    args.speculative_disable_batch_size = 8
    args.speculative_fallback_batched_draft_sync = True
    for k, v in flags.items():
        setattr(args, k, v)
    with pytest.raises(ValueError, match=message):
        args._handle_speculative_switch()


def test_every_bench_config_passes_flags_the_server_knows():
    # The benchmark starts real servers with these; a misspelt flag would fail only on a GPU box.
    import argparse
    import sys
    from pathlib import Path

    from sglang.srt.server_args import ServerArgs

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench.configs import CONFIGS

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    for config in CONFIGS.values():
        if config.since:  # upstream's own flags of a later release (the bench refuses them here)
            continue
        _, unknown = parser.parse_known_args(["--model-path", "m", *config.flags])
        assert not unknown, f"bench config {config.name} passes flags the server does not know: {unknown}"
