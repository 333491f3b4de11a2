"""The learned switch (0014's `auto`) under DP attention (0015): both DP ranks probe at the same steps.

Two DP ranks, each a scheduler with its own batch, pools, v1 EAGLEWorker and learner, and a
simulated GPU clock of its own (its own speed and noise; rank 1's clock ticks every 16 ms, so many
of its steps last 0 s). Every step goes through SGLang's prepare_mlp_sync_batch_raw (the all-gather
between the two ranks, run as two threads, is the only stand-in on that path), the worker's
decision (forward_batch_generation: an idle rank decides too), and the scheduler's own result
processing (process_batch_result_decode, or process_batch_result_idle for an idle rank), which
reports the step to the switch. The thresholds travel as the scheduler sends them: the entry
rank's recv_requests appends them, every rank dispatches that list before the step. Stood in for:
the forwards (a plain step returns the worker's result at once, a speculative one stops at the
draft), output streaming, and the result of a prefill step (SGLang's extend path).
"""

from __future__ import annotations

import contextlib
import copy
import random
import threading
import types

import torch
from sglang.srt.managers.utils import GenerationBatchResult
from switch_sim import CAP, SimulatedGpu, nothing_waiting, scheduler_idle_batch, two_dp_ranks

from sglang_cpu import (
    make_pools,
    make_req,
    make_server_args,
    prefill_batch,
    prefilled_decode_batch,
    write_tiny_llama_config,
)

SIZES = [0, 1, 2, 3, 5, 8, 12, 16, 20, 24, 30, 36, 44]


class Speculated(Exception):
    """The speculative step reached the draft's multi-step forward (a GPU forward)."""


def _without_dp_attention(server_args):
    entry_args = copy.copy(server_args)
    entry_args.enable_dp_attention, entry_args.language_only = False, False
    return entry_args


class DpRank:
    """One DP rank's scheduler and v1 worker with the auto switch, on its own clock."""

    def __init__(self, server_args, rank: int, speed: float, noise: float, tick: float) -> None:
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.speculative.eagle_worker import EAGLEWorker
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        from sglang.srt.speculative.spec_switch import SpecSwitch
        from sglang.srt.speculative.spec_switch_auto import AutoThreshold

        self.rank, self.speed, self.tick = rank, speed, tick
        self.gpu, self.rng, self.now = SimulatedGpu(noise=noise), random.Random(rank), 0.0
        self.pools = make_pools(server_args, max_reqs=512)
        self.batches: dict = {}
        self.kinds: list = []
        self.accepted = 0

        worker = object.__new__(EAGLEWorker)
        # A clock of the rank's own, read as the scheduler reads perf_counter: coarse on rank 1.
        worker.spec_switch = SpecSwitch.learning(AutoThreshold(CAP, clock=lambda: self.now - self.now % self.tick))
        worker.server_args, worker.speculative_algorithm = server_args, SpeculativeAlgorithm.EAGLE3
        worker.draft_tp_context = lambda group: contextlib.nullcontext()
        worker._model_runner = types.SimpleNamespace(tp_group=None)  # the draft's
        worker.forward_plain_decode = self._plain_step
        worker.draft = self._draft
        self.worker, self.switch = worker, worker.spec_switch

        scheduler = object.__new__(Scheduler)
        scheduler.__dict__.update(
            draft_worker=worker, forward_ct=0, forward_ct_decode=0, num_generated_tokens=0, spec_num_accepted_tokens=0,
            spec_num_forward_ct=0, enable_metrics=False, current_scheduler_metrics_enabled=False, enable_overlap=False,
            server_args=server_args, token_to_kv_pool_allocator=self.pools.allocator, tree_cache=self.pools.tree_cache,
            req_to_token_pool=self.pools.req_to_token_pool,
            stream_output=lambda *args, **kwargs: None, stream_output_generation=lambda *args, **kwargs: None,
            is_stats_logging_rank=False,  # 0.5.10 reads it after each decode
        )  # fmt: skip
        scheduler.init_request_dispatcher()
        if rank == 0:  # the entry rank: TP rank 0, whose control requests every rank receives
            idle = types.SimpleNamespace(recv_pyobj=nothing_waiting)
            scheduler.__dict__.update(
                recv_skipper=None, pp_rank=0, tp_rank=0, attn_tp_rank=0, attn_cp_rank=0, max_recv_per_poll=-1,
                recv_from_tokenizer=idle, recv_from_rpc=idle, input_blocker=None, tp_size=1, enable_trace=False,
                # recv_requests of one process: nothing to broadcast (the test hands the list on).
                server_args=_without_dp_attention(server_args),
            )  # fmt: skip
        self.scheduler = scheduler

    def local_batch(self, step):
        """This step's batch before the MLP sync: a decode batch of its size, a prefill, or none."""
        if step == "prefill":
            req = make_req(f"p{self.scheduler.forward_ct}", 4)
            req.logprob_start_len = 3  # as the scheduler sets it for a request without logprobs
            return prefill_batch(self.pools, [req], overlap=False)
        if step == 0:
            return None
        if step not in self.batches:
            reqs = [make_req(f"b{step}r{i}", 4 + i % 3, max_new_tokens=1 << 20) for i in range(step)]
            self.batches[step] = prefilled_decode_batch(self.pools, reqs, [100 + i for i in range(step)])
        return self.batches[step]

    def run(self, batch) -> None:
        """Scheduler.run_batch and process_batch_result for the batch the MLP sync left."""
        self.scheduler.forward_ct += 1
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            # A prefill step on some rank (SGLang's extend path, not run here): what it returns.
            self.kinds.append("extend")
            result = GenerationBatchResult(next_token_ids=torch.zeros(batch.batch_size()), num_accepted_tokens=0)
            self._advance(False, batch.batch_size())
        else:
            try:
                result = self.worker.forward_batch_generation(batch)
                self.kinds.append("plain")
            except Speculated:
                self.kinds.append("speculate")
                bs = batch.batch_size()
                accepted = self._advance(True, bs)
                # As a verify reports them: per request (0.5.10 reads these), then in total.
                per_req = [accepted // bs + (i < accepted % bs) for i in range(bs)]
                result = GenerationBatchResult(
                    next_token_ids=torch.zeros(accepted + bs, dtype=torch.int64),
                    num_accepted_tokens=accepted,
                    accept_length_per_req_cpu=per_req,
                )
        if batch.forward_mode.is_decode():
            self.scheduler.process_batch_result_decode(batch, result)
        elif batch.forward_mode.is_idle():
            self.scheduler.process_batch_result_idle(batch, result)
        # A prefill's result goes to process_batch_result_prefill, which reports nothing.

    def _plain_step(self, batch):
        self._advance(False, batch.batch_size())
        bs = batch.batch_size()
        # As the v1 fallback step reports it (0004): one token a request, none accepted.
        return GenerationBatchResult(
            next_token_ids=torch.zeros(bs), num_accepted_tokens=0, accept_length_per_req_cpu=[0] * bs, spec_skipped=True
        )

    def _draft(self, batch):
        raise Speculated

    def _advance(self, speculative: bool, batch_size: int) -> int:
        seconds, accepted = self.gpu.step(speculative, batch_size, self.rng)
        self.now += seconds * self.speed
        self.accepted += accepted
        return accepted


def _gathered(ranks, steps, gather):
    """SGLang's MLP sync of both ranks' batches (None where no rank has one)."""
    from sglang.srt.managers.scheduler_dp_attn_mixin import prepare_mlp_sync_batch_raw

    out = [None, None]

    def run(rank):
        gather.rank.value = rank.rank
        out[rank.rank] = prepare_mlp_sync_batch_raw(
            rank.local_batch(steps[rank.rank]), dp_size=2, attn_tp_size=1, attn_cp_size=1,
            tp_group=types.SimpleNamespace(device_group=None, cpu_group=None, device="cpu"),
            get_idle_batch=lambda: scheduler_idle_batch(rank.pools), disable_cuda_graph=False, require_mlp_tp_gather=True,
            disable_overlap_schedule=True, offload_tags=set(),
        )  # fmt: skip

    threads = [threading.Thread(target=run, args=(rank,)) for rank in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


def _load(seed: int, phases: int):
    """Per step, each rank's batch: phases of unequal sizes, a rank idle at times, a prefill now and then."""
    rng = random.Random(seed)
    for _ in range(phases):
        sizes = (rng.choice(SIZES), rng.choice(SIZES))
        for step in range(rng.randint(30, 120)):
            if step == 7:
                yield ("prefill", 0) if rng.random() < 0.5 else (0, "prefill")
            elif step % 11 == 5:  # a rank's batch finished, the other's goes on
                yield (sizes[0], 0) if rng.random() < 0.5 else (0, sizes[1])
            else:
                yield sizes


def _serve(tmp_path, monkeypatch, phases=48):
    server_args = make_server_args(
        write_tiny_llama_config(tmp_path / "m"), enable_dp_attention=True, dp_size=2, tp_size=2,
        speculative_disable_batch_size="auto",
    )  # fmt: skip
    gather = two_dp_ranks(monkeypatch)
    ranks = [DpRank(server_args, 0, speed=1.0, noise=0.02, tick=1e-9), DpRank(server_args, 1, 1.3, 0.08, tick=16e-3)]
    thresholds = []
    for steps in _load(seed=3, phases=phases):
        recv_reqs = ranks[0].scheduler.recv_requests()  # broadcast: every rank processes this list
        for rank in ranks:
            for recv_req in recv_reqs:
                assert rank.scheduler._request_dispatcher(recv_req) is None
        batches = _gathered(ranks, steps, gather)
        if all(batch is None for batch in batches):
            continue  # no rank has a batch: none runs one
        for rank, batch in zip(ranks, batches, strict=True):
            rank.run(batch)
        thresholds.append(ranks[0].switch.disable_batch_size)
    return ranks, thresholds


def test_dp_ranks_learning_thresholds_take_every_step_alike(tmp_path, monkeypatch):
    """Unequal batches, a rank idle or prefilling while the other decodes, a rank crossing the
    thresholds alone, each rank's own step times: every step, probes included, is of one kind on
    both ranks, and the entry rank's learner moves the thresholds."""
    ranks, thresholds = _serve(tmp_path, monkeypatch)
    kinds0, kinds1 = ranks[0].kinds, ranks[1].kinds
    assert len(kinds0) > 3000
    assert kinds0 == kinds1
    assert ranks[0].switch.status() == ranks[1].switch.status()
    assert ranks[0].switch.auto.probes.probe_steps > 0
    assert {"plain", "speculate", "extend"} <= set(kinds0)
    assert len(set(thresholds)) > 2 and thresholds[-1] > 8, sorted(set(thresholds))  # from the prior
    # The learners count the same steps; only their durations differ.
    learners = [rank.switch.auto.learner for rank in ranks]
    assert {key: t.samples for key, t in learners[0].times.items()} == {
        key: t.samples for key, t in learners[1].times.items()
    }
    assert [t.seconds for t in learners[0].times.values()] != [t.seconds for t in learners[1].times.values()]
    # The acceptance is per request of the rank's own batch: an idle rank or the smaller one does
    # not dilute it by the largest rank's size.
    for learner in learners:
        assert abs(learner.acceptance.tokens_per_step - SimulatedGpu().accept_length) < 0.2


def test_fed_the_local_batch_size_the_ranks_probe_apart(tmp_path, monkeypatch):
    """What the scheduler reported before: each rank's step costs by its own batch size (an idle
    rank's not at all). The ranks then count different steps per size and probe at other steps."""
    import sglang.srt.speculative.spec_switch as spec_switch

    monkeypatch.setattr(spec_switch, "switch_batch_size", lambda batch: batch.batch_size())
    ranks, _ = _serve(tmp_path, monkeypatch, phases=16)
    assert ranks[0].kinds != ranks[1].kinds
