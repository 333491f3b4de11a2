"""The auto switch's CPU simulation (0014): a GPU cost model, one rank's v2 worker and scheduler
around the real switch, and the decode loop that serves a load; shared by the auto switch's tests
on TP and DP ranks.

Only the GPU is simulated: a step's duration comes from a cost model of a GPU-bound target (a fixed
part and a part per request, speculative steps dearer, each request gaining `accept_length` tokens
per speculative step), with multiplicative noise, on a clock of the rank's own. A v2 catch-up
costs a plain step and an extend over the positions each request decoded while off (the
sequences do not grow here, so the rank counts those positions itself).
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
import types
from dataclasses import dataclass
from typing import Any

import torch
import zmq
from sglang.srt.managers.utils import GenerationBatchResult

from sglang_cpu import init_single_rank_groups, make_req, prefilled_decode_batch, use_torch_kernels

CAP = 64


@dataclass
class SimulatedGpu:
    plain: tuple[float, float] = (4e-3, 5e-5)  # seconds per step: fixed, per request
    spec: tuple[float, float] = (7e-3, 2.5e-4)
    accept_length: float = 2.7  # tokens per request per speculative step, the bonus included
    noise: float = 0.02
    # Seconds per token a catch-up extends: an 8B model's prefill. The H200 measured 14-15 us a
    # position on the trained pair's target (2026-12-05): dearer here, as a larger target's is.
    extend: float = 2.7e-5

    def crossover(self) -> float:
        """The batch size where both modes give the same tokens per second."""
        (a_p, b_p), (a_s, b_s), length = self.plain, self.spec, self.accept_length
        if b_s <= length * b_p:  # speculation's extra cost per request never catches up
            return math.inf if length * a_p > a_s else 0.0
        return (length * a_p - a_s) / (b_s - length * b_p)

    def step(self, speculative: bool, batch_size: int, rng: random.Random) -> tuple[float, int]:
        fixed, per_request = self.spec if speculative else self.plain
        seconds = (fixed + per_request * batch_size) * rng.uniform(1 - self.noise, 1 + self.noise)
        if not speculative:
            return seconds, 0
        # Whole tokens with the mean of accept_length (at a batch of 1, 1.6 is not 2).
        expected = batch_size * (self.accept_length - 1)
        accepted = math.floor(expected) + (rng.random() < expected - math.floor(expected))
        return seconds, accepted


class Speculated(Exception):
    pass


CAUGHT_UP = "catch-up"


class Rank:
    """One TP rank: the v2 worker with the auto switch, a scheduler around it, its own clock."""

    def __init__(self, env, seed: int, entry: bool, switch: Any = None):
        """switch: a fixed SpecSwitch instead of the learning one (the open loop's references)."""
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
        from sglang.srt.speculative.spec_switch import SpecSwitch
        from sglang.srt.speculative.spec_switch_auto import AutoThreshold
        from sglang.srt.speculative.spec_switch_v2 import DeferredDraftSyncV2

        self.env, self.rng, self.now = env, random.Random(seed), 0.0
        auto = AutoThreshold(CAP, clock=lambda: self.now)
        worker = object.__new__(EAGLEWorkerV2)
        worker.spec_switch = switch or SpecSwitch.learning(auto)
        sync = worker.deferred_draft_sync = DeferredDraftSyncV2(max_catch_up_tokens=4096)
        # What the real steps leave in the deferred sync's bookkeeping.
        worker.forward_plain_decode = lambda mwb: sync.fell_behind(mwb, mwb.seq_lens_cpu)
        worker.forward_catch_up = lambda mwb: (sync.forget(mwb), CAUGHT_UP)[1]

        def draft(mwb):
            raise Speculated

        worker._draft_worker = types.SimpleNamespace(
            draft_tp_context=lambda group: contextlib.nullcontext(),
            draft_runner=types.SimpleNamespace(tp_group=None),
            draft=draft,
        )
        self.worker, self.switch = worker, worker.spec_switch
        scheduler = object.__new__(Scheduler)
        scheduler.draft_worker = worker
        scheduler.init_request_dispatcher()
        if entry:
            idle = types.SimpleNamespace(recv_pyobj=nothing_waiting)
            scheduler.__dict__.update(
                recv_skipper=None,
                pp_rank=0,
                tp_rank=0,
                attn_tp_rank=0,
                attn_cp_rank=0,
                max_recv_per_poll=-1,
                recv_from_tokenizer=idle,
                recv_from_rpc=idle,
                input_blocker=None,
                tp_size=1,
                server_args=types.SimpleNamespace(enable_dp_attention=False, language_only=False),
                enable_trace=False,
            )
        self.scheduler = scheduler
        self.batch: Any = None
        self.worker_batch: Any = None
        self.forward_ct = 0
        self.kinds: list[str] = []
        self.slots: dict[str, int] = {}  # KV slots each request holds
        self.behind: dict[str, int] = {}  # positions each request's draft lacks

    def decode_batch(self, batch_size: int):
        """The running batch at this size: when the size changes, every request leaves and a new
        batch of that size is prefilled as SGLang prefills."""
        if self.batch is None or len(self.batch.reqs) != batch_size:
            if self.batch is not None:
                self.finish(set(range(len(self.batch.reqs))))
            self.admit(batch_size)
        return self.worker_batch

    def step(self, batch_size: int, gpu: SimulatedGpu) -> int:
        """One decode step: the decision, the simulated forward, the scheduler's report; the
        drafts the batch accepted."""
        speculative = False
        try:
            kind = self.worker.forward_batch_generation(self.decode_batch(batch_size)) or "plain"
        except Speculated:
            speculative, kind = True, "speculate"
        self.kinds.append(kind)
        seconds, accepted = gpu.step(speculative, batch_size, self.rng)
        if kind == CAUGHT_UP:  # a plain step's target work and the extend over what it owes
            seconds += gpu.extend * self._caught_up()
        self._fall_behind(kind)
        self.now += seconds
        self.forward_ct += 1
        result = GenerationBatchResult(
            num_accepted_tokens=accepted, spec_skipped=not speculative, spec_catch_up=kind == CAUGHT_UP
        )
        self.switch.observe_step(self.forward_ct, self.batch, result)
        return accepted

    def _caught_up(self) -> int:
        """The tokens the catch-up extends over: each request's positions decoded while off and
        its pending one, within the sync's budget (DeferredDraftSyncV2.catch_up_starts)."""
        sync = self.worker.deferred_draft_sync
        window = max(1, sync.max_catch_up_tokens // len(self.batch.reqs)) - 1
        return sum(1 + min(window, self.behind.get(req.rid, 0)) for req in self.batch.reqs)

    def _fall_behind(self, kind: str) -> None:
        for req in self.batch.reqs:
            if kind == "plain":
                self.behind[req.rid] = self.behind.get(req.rid, 0) + 1
            else:
                self.behind.pop(req.rid, None)

    def admit(self, count: int) -> None:
        """`count` new requests prefilled and merged into the running batch, as the scheduler
        merges a prefill."""
        self.forward_ct += 1  # their prefill ran between the decode steps
        reqs = [make_req(f"a{self.forward_ct}r{i}", prompt_len=4 + i % 3) for i in range(count)]
        available = self.env.allocator.available_size()
        new = prefilled_decode_batch(self.env, reqs, [100 + i for i in range(count)], overlap=True, topk=1)
        seq_lens = new.seq_lens_cpu.tolist()
        reserved = (available - self.env.allocator.available_size() - sum(seq_lens)) // count
        self.slots.update({req.rid: seq_len + reserved for req, seq_len in zip(reqs, seq_lens, strict=True)})
        if self.batch is None:
            self.batch = new
        else:
            self.batch.merge_batch(new)
        self.worker_batch = self.batch.get_model_worker_batch()

    def finish(self, finished: set[int]) -> None:
        """The requests at these batch indices leave it (SGLang's filter_batch): no prefill, the
        next decode step follows back to back."""
        for i in sorted(finished):
            req = self.batch.reqs[i]
            self.behind.pop(req.rid, None)
            row = self.env.req_to_token_pool.req_to_token[req.req_pool_idx]
            self.env.allocator.free(row[: self.slots.pop(req.rid)].clone())
            self.env.req_to_token_pool.free(req)
        keep = [i for i in range(len(self.batch.reqs)) if i not in finished]
        if not keep:
            self.batch = self.worker_batch = None
            return
        self.batch.filter_batch(keep_indices=keep)
        self.worker_batch = self.batch.get_model_worker_batch()

    def receive(self) -> list:
        """The entry rank's request list for this iteration (nothing waits but the thresholds)."""
        return self.scheduler.recv_requests()

    def process(self, recv_reqs: list) -> None:
        """What process_input_requests does with each of them: SGLang's own dispatch."""
        for recv_req in recv_reqs:
            assert self.scheduler._request_dispatcher(recv_req) is None


def nothing_waiting(flags=0):
    raise zmq.ZMQError(zmq.EAGAIN)


def serve(ranks: list[Rank], load: list[tuple[int, int]], gpu: SimulatedGpu) -> list[int]:
    """Decode `steps` steps at each (batch size, steps); the thresholds after each phase."""
    thresholds = []
    for batch_size, steps in load:
        for _ in range(steps):
            recv_reqs = ranks[0].receive()  # broadcast: every rank processes the same list
            for rank in ranks:
                rank.process(list(recv_reqs))
                rank.step(batch_size, gpu)
        thresholds.append(ranks[0].switch.disable_batch_size)
    return thresholds


@dataclass(frozen=True)
class Arrivals:
    """An open loop: requests arriving at `rate` a second (Poisson, on the rank's clock), each
    decoding `tokens` tokens; each prefill between decode steps costs `prefill_seconds`."""

    rate: float
    tokens: int = 256
    prefill_seconds: float = 0.02
    seed: int = 0  # the arrival times' own, so that every switch meets the same traffic


class OpenLoop:
    """Requests arriving on one rank and leaving once they have their tokens."""

    def __init__(self, rank: Rank, arrivals: Arrivals, gpu: SimulatedGpu):
        self.rank, self.arrivals, self.gpu = rank, arrivals, gpu
        self.times = random.Random(arrivals.seed)
        self.next_arrival = rank.now + self.times.expovariate(arrivals.rate)
        self.left: list[int] = []  # the tokens each request in the batch has still to decode
        self.admitted_at: list[float] = []
        self.seconds_per_token: list[float] = []  # of each request finished, in that order

    def serve(self, steps: int) -> list[int]:
        """`steps` decode steps: the batch size of each. A speculative step gives each request
        1 + its share of the accepted drafts."""
        rank = self.rank
        sizes: list[int] = []
        while len(sizes) < steps:
            self._admit()
            accepted = rank.step(len(self.left), self.gpu)
            sizes.append(len(self.left))
            share, extra = divmod(accepted, len(self.left))
            lucky = set(rank.rng.sample(range(len(self.left)), extra))
            self.left = [n - 1 - share - (i in lucky) for i, n in enumerate(self.left)]
            self._finish({i for i, n in enumerate(self.left) if n <= 0})
        return sizes

    def _admit(self) -> None:
        """The requests arrived by now, in one prefill; with none running, the clock jumps to
        the next arrival."""
        rank, arrived = self.rank, 0
        while self.next_arrival <= rank.now or not self.left and not arrived:
            rank.now = max(rank.now, self.next_arrival)
            arrived += 1
            self.next_arrival += self.times.expovariate(self.arrivals.rate)
        if arrived:
            rank.admit(arrived)
            rank.now += self.arrivals.prefill_seconds
            self.left += [self.arrivals.tokens] * arrived
            self.admitted_at += [rank.now] * arrived
        rank.process(rank.receive())

    def _finish(self, finished: set[int]) -> None:
        if not finished:
            return
        self.rank.finish(finished)
        for i in sorted(finished):
            self.seconds_per_token.append((self.rank.now - self.admitted_at[i]) / self.arrivals.tokens)
        self.left = [n for i, n in enumerate(self.left) if i not in finished]
        self.admitted_at = [t for i, t in enumerate(self.admitted_at) if i not in finished]


class TwoRankAllGather:
    """torch.distributed.all_gather_into_tensor between two threads, one per DP rank."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(2, timeout=30)
        self.slots: list = [None, None]
        self.rank = threading.local()

    def __call__(self, output: torch.Tensor, local: torch.Tensor, group=None) -> None:
        self.slots[self.rank.value] = local.clone()
        self.barrier.wait()
        output.copy_(torch.cat(self.slots))
        self.barrier.wait()


def two_dp_ranks(monkeypatch) -> TwoRankAllGather:
    """Two DP-attention ranks as threads of this process: torch kernels, single-rank groups, the
    all-gather between them, both ranks active. Each thread sets its `gather.rank.value`."""
    import sglang.srt.managers.scheduler_dp_attn_mixin as dp_mixin

    use_torch_kernels(monkeypatch)
    init_single_rank_groups()
    gather = TwoRankAllGather()
    monkeypatch.setattr(torch.distributed, "all_gather_into_tensor", gather)
    active = types.SimpleNamespace(active_ranks_cpu=torch.ones(2, dtype=torch.int32))
    monkeypatch.setattr(dp_mixin, "get_tp_group", lambda: active)
    return gather


def scheduler_idle_batch(pools):
    """Scheduler.get_idle_batch, SGLang's own, on a rank's pools: what the MLP sync pads an idle
    DP rank with."""
    from sglang.srt.managers.scheduler_dp_attn_mixin import SchedulerDPAttnMixin
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    scheduler = types.SimpleNamespace(
        req_to_token_pool=pools.req_to_token_pool, token_to_kv_pool_allocator=pools.allocator,
        tree_cache=pools.tree_cache, model_config=pools.model_config, enable_overlap=False,
        spec_algorithm=SpeculativeAlgorithm.EAGLE3,
    )  # fmt: skip
    return SchedulerDPAttnMixin.get_idle_batch(scheduler)
