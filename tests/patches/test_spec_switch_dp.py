"""The switch under DP attention (0015): two simulated DP ranks take one decision per step.

Each rank's scheduler holds its own batch, in its own pools, of its own size (one rank idle at
times). SGLang's prepare_mlp_sync_batch gathers the sizes (the collective between the two ranks,
run as two threads, is the only stand-in on that path) and pads an idle rank with its IDLE batch;
the v1 EAGLEWorker then decides and runs its step. Stood in for: the model forwards (the target
worker samples fixed tokens; the draft runner returns random logits) and the draft's multi-step
`draft` call, which a speculative step reaches first and which ends the step here.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types

import pytest
import torch
from switch_sim import scheduler_idle_batch, two_dp_ranks

from sglang_cpu import (
    HIDDEN,
    VOCAB,
    make_pools,
    make_req,
    make_server_args,
    model_runner_for_forward_batch,
    prefilled_decode_batch,
    write_tiny_llama_config,
)
from switch_helpers import forward_batch, handled_switch_args, verify_graph_runner

DISABLE, ENABLE = 8, 4
STEPS = 3  # the v1 draft of sglang_cpu: 3 steps, topk 4, 16 draft tokens
# Per step, each DP rank's decode batch size (0: idle): both small; rank 0 crosses N alone;
# rank 0 idle while rank 1 is large; rank 1 above M alone keeps speculation off; both at most
# M; rank 1 idle while rank 0 speculates.
SIZES = [(2, 0), (6, 3), (12, 2), (0, 20), (5, 9), (3, 4), (1, 0)]
KINDS = ["speculate", "speculate", "plain", "plain", "plain", "speculate", "speculate"]


class Speculated(Exception):
    """The speculative step reached the draft's multi-step forward (a GPU forward)."""


def _gathered_batches(ranks, sizes, gather, require_mlp_tp_gather):
    """Each rank's batch for one step after SGLang's MLP sync, run by both ranks at once."""
    from sglang.srt.managers.scheduler_dp_attn_mixin import prepare_mlp_sync_batch_raw

    out = [None, None]

    def run(rank):
        gather.rank.value = rank
        out[rank] = prepare_mlp_sync_batch_raw(
            ranks[rank].new_batch(sizes[rank]), dp_size=2, attn_tp_size=1, attn_cp_size=1,
            tp_group=types.SimpleNamespace(device_group=None, cpu_group=None, device="cpu"),
            get_idle_batch=ranks[rank].idle_batch, disable_cuda_graph=False,
            require_mlp_tp_gather=require_mlp_tp_gather, disable_overlap_schedule=True, offload_tags=set(),
        )  # fmt: skip

    threads = [threading.Thread(target=run, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(batch is not None for batch in out), "a rank's MLP sync failed"
    return out


class Rank:
    """One DP rank: its pools, its v1 EAGLEWorker, and what its forwards saw."""

    def __init__(self, pools, server_args, rank: int) -> None:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.pools, self.server_args, self.rank, self.step = pools, server_args, rank, 0
        if rank == 1:  # other allocations first: this rank's KV slots differ from rank 0's
            pools.allocator.alloc(37)
        self.events: list = []
        self.max_new_tokens = 64
        self.last_reqs: list = []  # the requests of the rank's latest batch
        self.idle_batch = functools.partial(scheduler_idle_batch, pools)
        self.worker = self._worker(SpeculativeAlgorithm.EAGLE3)

    def new_batch(self, n: int):
        if n == 0:
            return None
        reqs = [make_req(f"s{self.step}r{i}", 4 + i % 5, max_new_tokens=self.max_new_tokens) for i in range(n)]
        self.last_reqs = reqs
        return prefilled_decode_batch(self.pools, reqs, [100 + i for i in range(n)])

    def run(self, batch) -> None:
        self.events.append(("step", batch.forward_mode.name))
        with contextlib.suppress(Speculated):
            self.worker.forward_batch_generation(batch)
        self.step += 1

    def _worker(self, algorithm):
        from sglang.srt.speculative.eagle_worker import EAGLEWorker
        from sglang.srt.speculative.spec_switch import SpecSwitch

        worker = object.__new__(EAGLEWorker)
        worker.server_args, worker.model_config = self.server_args, self.pools.model_config
        worker.spec_switch = SpecSwitch(DISABLE, ENABLE)
        worker.topk, worker.speculative_num_steps, worker.page_size, worker.device = 4, STEPS, 1, "cpu"
        worker.speculative_algorithm, worker.eagle_use_aux_hidden_state = algorithm, True
        worker.enable_nan_detection, worker.cuda_graph_runner_for_draft_extend = False, None
        worker.draft_tp_context = lambda group: contextlib.nullcontext()
        worker.target_worker = types.SimpleNamespace(forward_batch_generation=self._target_forward)
        worker._model_runner = self._draft_runner()  # the draft's (EAGLEWorker.draft_model_runner)
        worker.draft = self._draft
        return worker

    def _target_forward(self, model_worker_batch):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch

        runner = model_runner_for_forward_batch(self.pools, self.server_args)
        runner.attn_backend = None  # its forward is stood in for
        forward_batch = ForwardBatch.init_new(model_worker_batch, runner)
        self.events.append(_forward_event("target", forward_batch))
        bs = len(model_worker_batch.seq_lens)
        logits = LogitsProcessorOutput(
            next_token_logits=torch.randn(bs, VOCAB), hidden_states=torch.randn(bs, 3 * HIDDEN)
        )
        return GenerationBatchResult(logits_output=logits, next_token_ids=torch.arange(bs) + 200)

    def _draft_runner(self):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        runner = model_runner_for_forward_batch(self.pools, self.server_args)
        runner.is_draft_worker, runner.tp_group = True, None
        runner.attn_backend = types.SimpleNamespace(init_forward_metadata=lambda forward_batch: None)

        def forward(forward_batch, **kwargs):
            self.events.append(_forward_event("draft_extend", forward_batch))
            n = len(forward_batch.seq_lens)
            logits = LogitsProcessorOutput(
                next_token_logits=torch.randn(n, VOCAB), hidden_states=torch.randn(n, HIDDEN)
            )
            return types.SimpleNamespace(logits_output=logits)

        runner.forward = forward
        return runner

    def _draft(self, batch):
        self.events.append(("speculate", batch.forward_mode.name))
        raise Speculated


def _forward_event(name, forward_batch):
    """What the MLP sync of a forward sees: its mode, spec_info, and every rank's token count."""
    return (name, forward_batch.forward_mode.name, forward_batch.spec_info is None, forward_batch.global_num_tokens_cpu)


def _run_ramp(tmp_path, monkeypatch, require_mlp_tp_gather):
    server_args = make_server_args(
        write_tiny_llama_config(tmp_path / "m"), enable_dp_attention=True, dp_size=2, tp_size=2,
        speculative_disable_batch_size=DISABLE, speculative_enable_batch_size=ENABLE,
    )  # fmt: skip
    gather = two_dp_ranks(monkeypatch)
    ranks = [Rank(make_pools(server_args), server_args, rank) for rank in (0, 1)]
    for sizes in SIZES:
        for rank, batch in zip(ranks, _gathered_batches(ranks, sizes, gather, require_mlp_tp_gather), strict=True):
            rank.run(batch)
    return ranks, gather


def _steps(events):
    """The events of each step, split at the step markers."""
    steps: list = []
    for event in events:
        if event[0] == "step":
            steps.append([])
        steps[-1].append(event)
    return steps


@pytest.mark.parametrize("require_mlp_tp_gather", [True, False], ids=["mlp-gather", "a2a-no-mlp-gather"])
def test_dp_ranks_run_the_same_kind_of_step(tmp_path, monkeypatch, require_mlp_tp_gather):
    """Unequal batches, an idle rank, a rank past the threshold alone: one decision for both."""
    ranks, _ = _run_ramp(tmp_path, monkeypatch, require_mlp_tp_gather)
    steps0, steps1 = (_steps(rank.events) for rank in ranks)
    kinds = [
        ["speculate" if any(e[0] == "speculate" for e in step) else "plain" for step in steps]
        for steps in (steps0, steps1)
    ]
    assert kinds[0] == kinds[1] == KINDS
    assert ranks[0].worker.spec_switch.status() == ranks[1].worker.spec_switch.status()


def test_plain_steps_present_the_gathered_sizes_to_every_mlp_sync(tmp_path, monkeypatch):
    """In a step with speculation off, a busy rank runs a target DECODE and a one-token draft
    extend, an idle rank the IDLE forward of each; the target's sync sees the gathered batch
    sizes as they are, the draft extend's as a speculative step's draft extend scales them."""
    ranks, _ = _run_ramp(tmp_path, monkeypatch, True)
    for rank in ranks:
        for sizes, kind, step in zip(SIZES, KINDS, _steps(rank.events), strict=True):
            n = sizes[rank.rank]
            if kind == "speculate":
                assert step == [("step", "DECODE" if n else "IDLE"), ("speculate", "DECODE" if n else "IDLE")]
                continue
            gathered = list(sizes)
            assert step == [
                ("step", "DECODE" if n else "IDLE"),
                ("target", "DECODE" if n else "IDLE", True, gathered),
                ("draft_extend", "DRAFT_EXTEND" if n else "IDLE", False, [s * (STEPS + 1) for s in gathered]),
            ], (rank.rank, sizes)


def test_a_rank_whose_requests_all_finish_still_joins_the_draft_extend(tmp_path, monkeypatch):
    """The draft extend is a collective under DP attention: a rank whose requests all finished in
    a plain step runs it idle, as after a verify that finished them."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    copy = ScheduleBatch.copy

    def copy_on_this_device(batch):
        # ScheduleBatch.copy leaves the copy on the field's default device, "cuda".
        result = copy(batch)
        result.device = batch.device
        return result

    monkeypatch.setattr(ScheduleBatch, "copy", copy_on_this_device)
    ranks, gather = _run_ramp(tmp_path, monkeypatch, True)
    ranks[1].max_new_tokens = 2  # the prefill's token and this step's: done
    for rank, batch in zip(ranks, _gathered_batches(ranks, (12, 1), gather, True), strict=True):
        rank.run(batch)
    assert all(req.finished() for req in ranks[1].last_reqs)
    assert _steps(ranks[1].events)[-1] == [
        ("step", "DECODE"),
        ("target", "DECODE", True, [12, 1]),
        ("draft_extend", "IDLE", False, [12 * (STEPS + 1), 1 * (STEPS + 1)]),
    ]


def _graph_runners():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    verify = verify_graph_runner(max_bs=DISABLE)  # the verify graphs stop at N (0007)
    decode = verify_graph_runner(max_bs=64)
    decode.capture_forward_mode, decode.num_tokens_per_bs, decode.plain_decode = ForwardMode.DECODE, 1, True
    for runner in (verify, decode):
        runner.require_mlp_tp_gather = runner.require_mlp_sync = True
    return verify, decode


def _replayed(verify, decode, forward_batch):
    """Which graph set the target's forward replays, and at which padded size."""
    from sglang.srt.model_executor.model_runner import ModelRunner

    calls = []
    for name, runner in (("verify", verify), ("decode", decode)):
        runner.replay = functools.partial(lambda name, fb, **_: calls.append(name), name)
    model_runner = object.__new__(ModelRunner)
    model_runner.device, model_runner.graph_runner, model_runner.decode_graph_runner = "cuda", verify, decode
    model_runner._forward_raw(forward_batch, False, None)
    return calls


def test_an_idle_rank_replays_the_graph_set_of_its_peers_plain_decode(tmp_path):
    """With speculation off the busy rank replays a DECODE graph sized by the largest gathered
    batch; the idle rank must replay the same set (the verify set has other collectives)."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

    make_server_args(write_tiny_llama_config(tmp_path / "m"), enable_dp_attention=True, dp_size=2)
    verify, decode = _graph_runners()
    busy, idle = forward_batch(ForwardMode.DECODE, 20, 1), forward_batch(ForwardMode.IDLE, 0, 1)
    for fb in (busy, idle):
        fb.global_num_tokens_cpu, fb.can_run_dp_cuda_graph = [20, 0], True
    assert _replayed(verify, decode, busy) == _replayed(verify, decode, idle) == ["decode"]

    # An idle rank in a speculative step carries the verify input: the verify set, as its peers.
    idle.spec_info = types.SimpleNamespace(capture_hidden_mode=CaptureHiddenMode.FULL)
    idle.global_num_tokens_cpu = [4 * 16, 0]
    assert _replayed(verify, decode, idle) == ["verify"]


@pytest.mark.parametrize(
    "overrides, env, message",
    [
        ({}, {"SGLANG_ENABLE_SPEC_V2": "1"}, "needs the v1 EAGLE worker"),
        ({"speculative_disable_batch_size": "auto"}, {"SGLANG_ENABLE_SPEC_V2": "1"}, "needs the v1 EAGLE worker"),
        ({}, {"SGLANG_SCHEDULER_SKIP_ALL_GATHER": "1"}, "SGLANG_SCHEDULER_SKIP_ALL_GATHER"),
    ],
)
def test_parts_that_cannot_agree_are_refused_at_start_up(tmp_path, monkeypatch, overrides, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = {"enable_dp_attention": True, "dp_size": 2, "tp_size": 2, "speculative_disable_batch_size": 8, **overrides}
    with pytest.raises(ValueError, match=message):
        handled_switch_args(tmp_path, **args)


def test_v1_with_fixed_thresholds_starts_under_dp_attention(tmp_path, monkeypatch):
    monkeypatch.delenv("SGLANG_ENABLE_SPEC_V2", raising=False)
    args = handled_switch_args(
        tmp_path, enable_dp_attention=True, dp_size=2, tp_size=2, speculative_disable_batch_size=8
    )
    assert (args.speculative_disable_batch_size, args.speculative_enable_batch_size) == (8, 6)


def test_v1_with_auto_starts_under_dp_attention(tmp_path, monkeypatch):
    """The ranks' learners count the same steps (test_spec_switch_dp_auto.py), so auto is accepted."""
    monkeypatch.delenv("SGLANG_ENABLE_SPEC_V2", raising=False)
    args = handled_switch_args(
        tmp_path, enable_dp_attention=True, dp_size=2, tp_size=2, speculative_disable_batch_size="auto"
    )
    assert args.speculative_switch_auto
    assert (args.speculative_disable_batch_size, args.speculative_enable_batch_size) == (64, 1)
