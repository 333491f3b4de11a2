"""Spec v2 under the overlap scheduler on CPU, on the releases that relay it through the pool-indexed
FutureMap (0.5.1x on; 0.5.9's tests keep to sglang_cpu.prefilled_decode_batch): a decode batch as the
scheduler hands it to the v2 worker, and the overlap loop around a real EAGLEWorkerV2 whose two
models are stood in for (verify_cpu), with SGLang's own output processor.

The scheduler's steps are SGLang's own code (the FutureMap, Scheduler._forward_isolation and
_relay_forward_payload, SchedulerBatchResultProcessor); where the releases differ, the one in use is
told apart by what its classes and modules have (see sglang_cpu).
"""

from __future__ import annotations

import inspect
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, List, Optional, Sequence

import torch
from verify_cpu import PlannedLogits, StandInDraft, StandInTarget, spec_worker, use_torch_verify, word_tokenizer

from sglang_cpu import (
    HIDDEN,
    TOPK,
    Pools,
    init_single_rank_groups,
    make_pools,
    make_server_args,
    prefill_batch,
    sglang_module,
    use_torch_kernels,
    write_tiny_llama_config,
)

if TYPE_CHECKING:  # annotations only: SGLang is importable once conftest has set sys.path
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch


def _attribute(candidates: Sequence[str], name: str) -> Any:
    """`name` from the first of the candidate modules that holds it (releases move things)."""
    for module_name in candidates:
        module = sglang_module(module_name)
        if module is not None and hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"none of {list(candidates)} has {name}")


def relay(pools: Pools, batch: ScheduleBatch, future_indices: torch.Tensor, result: Any) -> None:
    """Scheduler._relay_forward_payload, the scheduler's own stash of a spec-v2 worker's result for
    the next iteration (0.5.23 also passes it the batch)."""
    from sglang.srt.managers.scheduler import Scheduler

    scheduler = SimpleNamespace(
        spec_algorithm=batch.spec_algorithm, future_map=pools.future_map, chunked_req=None,
        beam_coordinator=SimpleNamespace(maybe_select_and_relay=lambda *args, **kwargs: None),
    )  # fmt: skip
    with_batch = "batch" in inspect.signature(Scheduler._relay_forward_payload).parameters
    Scheduler._relay_forward_payload(scheduler, *([batch] if with_batch else []), future_indices, result)


def carry_next_draft(batch: ScheduleBatch, draft: Any, future_indices: torch.Tensor) -> None:
    """run_batch after the forward: the next draft input onto the batch, whose next input ids come
    through the FutureMap (0.5.23 also notes whether the draft's DSA top-k indices were relayed)."""
    batch.input_ids = None
    batch.spec_info = draft
    if hasattr(draft, "future_dsa_topk_indices_available"):
        draft.future_dsa_topk_indices_available = draft.dsa_topk_indices is not None
    draft.future_indices = future_indices


def checkpoint(req: Req, tree_cache: Any) -> None:
    """The output processor's prefix-cache update for a request still running after its step."""
    if hasattr(sglang_module("sglang.srt.mem_cache.common"), "checkpoint_kv_cache"):  # 0.5.23
        from sglang.srt.mem_cache.common import checkpoint_kv_cache

        checkpoint_kv_cache(req, tree_cache)
    else:
        from sglang.srt.mem_cache.common import maybe_cache_unfinished_req

        maybe_cache_unfinished_req(req, tree_cache)


def _finish_prefill(pools: Pools, batch: ScheduleBatch, first_tokens: Sequence[int]) -> None:
    """The overlap scheduler's run_batch + output processing of the prefill, minus the forward.

    What the v2 worker hands back is stood in for: its new_seq_lens (the prompt lengths: spec v2
    counts a length before the step's tokens) is published, and its next draft input (the shapes
    and dtypes of _draft_extend_for_prefill's: top-k over float32 probs, the LAST hidden) relayed.
    """
    from sglang.srt.managers.overlap_utils import resolve_forward_inputs
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    fm, bs, future_indices = pools.future_map, len(batch.reqs), batch.req_pool_indices
    resolve_forward_inputs(batch, fm)  # the prompt tokens' H2D (prefill_input_ids_cpu -> input_ids)
    fm.publish(future_indices, batch.seq_lens)
    draft = EagleDraftInput(
        topk_p=torch.full((bs, TOPK), 1.0 / TOPK), topk_index=torch.arange(TOPK).repeat(bs, 1) + 10,
        hidden_states=torch.randn(bs, HIDDEN), num_tokens_per_req=1, num_tokens_for_logprob_per_req=1,
        bonus_tokens=torch.tensor(first_tokens, dtype=torch.int32),  # the sampler's next_token_ids
    )  # fmt: skip
    relay(pools, batch, future_indices, GenerationBatchResult(next_draft_input=draft))
    carry_next_draft(batch, draft, future_indices)
    for req, token in zip(batch.reqs, first_tokens, strict=True):
        req.output_ids.append(token)
        req.update_finish_state()
        if req.finished():
            raise AssertionError(f"{req.rid} finished at its first token; the decode batch needs it running")
        checkpoint(req, pools.tree_cache)


def resolve_inputs(pools: Pools, batch: ScheduleBatch) -> None:
    """run_batch's resolution before the worker call: the FutureMap's seq lens, then the forward
    inputs (prompt tokens of a prefill; a decode's spec extras: bonus tokens, top-k, hidden)."""
    from sglang.srt.managers.overlap_utils import resolve_forward_inputs

    pools.future_map.resolve_seq_lens_cpu(batch)  # seq_lens = new_seq_lens_buf[fi], CPU mirror, sum
    resolve_forward_inputs(batch, pools.future_map)


def _check_decode_state(pools: Pools, batch: ScheduleBatch, committed: List[int]) -> None:
    """Fail loudly where a wrong set-up would let a test pass: lengths, reserved slots, draft input."""
    reserve_per_decode = _attribute(
        ("sglang.srt.mem_cache.allocation_sizing", "sglang.srt.mem_cache.common"), "get_alloc_reserve_per_decode"
    )
    reserve, r2t = reserve_per_decode(), pools.req_to_token_pool.req_to_token
    kv = [getattr(r, "kv", r) for r in batch.reqs]  # 0.5.23 keeps a request's KV state in req.kv
    checks = {
        "seq_lens": (batch.seq_lens.tolist(), committed),
        "seq_lens_cpu": (batch.seq_lens_cpu.tolist(), committed),
        "seq_lens_sum": (batch.seq_lens_sum, sum(committed)),
        "kv_committed_len": ([k.kv_committed_len for k in kv], committed),
        "kv_allocated_len": ([k.kv_allocated_len for k in kv], [s + reserve for s in committed]),
        "bonus_tokens": (batch.spec_info.bonus_tokens.tolist(), [r.output_ids[-1] for r in batch.reqs]),
    }
    for name, (got, want) in checks.items():
        if got != want:
            raise AssertionError(f"decode batch {name} is {got}, expected {want}")
    slots = torch.cat([r2t[k.req_pool_idx, : k.kv_allocated_len] for k in kv])
    if bool((slots <= 0).any()) or slots.unique().numel() != slots.numel():
        raise AssertionError("req_to_token rows up to kv_allocated_len must hold distinct, allocated KV slots")


def spec_v2_decode_batch(pools: Pools, reqs: Sequence[Req], first_tokens: Sequence[int]) -> ScheduleBatch:
    """A speculative decode batch as the overlap scheduler holds it at the v2 worker's
    forward_batch_generation for the first decode step after prefill.

    Admission, prefill, FutureMap publish/stash, output processing, then update_running_batch's
    check_decode_mem + prepare_for_decode (eagle_prepare_for_decode: reserves KV ahead), then
    run_batch's FutureMap resolution and _forward_isolation's forward-only sampling info (no
    penalizer orchestrator). batch.seq_lens = length BEFORE this step's token (the bonus token's KV
    is written by the verify forward). As in the scheduler, input_ids is None and out_cache_loc is
    still the prefill's (eagle_prepare_for_decode writes the reserved slots into req_to_token only;
    the worker's draft sets its own). Needs `use_torch_kernels` active.
    """
    batch = prefill_batch(pools, reqs)
    _finish_prefill(pools, batch, first_tokens)
    if not batch.check_decode_mem():
        raise AssertionError("the KV pool cannot hold the decode reservation; raise max_tokens")
    batch.prepare_for_decode()
    resolve_inputs(pools, batch)
    batch.sampling_info = batch.sampling_info.copy_for_forward()
    _check_decode_state(pools, batch, [len(r.origin_input_ids) for r in reqs])
    return batch


class _Quiet:
    """Metrics, streaming and beam search, which the output processor reports to: nothing here."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class _Metrics(_Quiet):
    num_generated_tokens = forward_ct_decode = 0


def _build(cls: type, **known: Any) -> Any:
    """cls from those of `known` it declares: the releases add and drop fields."""
    declared = inspect.signature(cls).parameters
    return cls(**{name: value for name, value in known.items() if name in declared})


def result_processor(pools: Pools, worker: Any) -> Any:
    """SchedulerBatchResultProcessor on these pools, as Scheduler builds it for one overlap rank
    without disaggregation; metrics, streaming and beam search quiet."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor
    from sglang.srt.managers.scheduler_components.logprob_result_processor import SchedulerLogprobResultProcessor

    server_args = worker._target_worker.model_runner.server_args
    logprobs = _build(SchedulerLogprobResultProcessor, server_args=server_args, model_config=pools.model_config)
    return _build(
        SchedulerBatchResultProcessor, is_generation=True, disaggregation_mode=DisaggregationMode.NULL,
        enable_overlap=True, enable_overlap_mlx=False, server_args=server_args, model_config=pools.model_config,
        token_to_kv_pool_allocator=pools.allocator, tree_cache=pools.tree_cache, hisparse_coordinator=None,
        req_to_token_pool=pools.req_to_token_pool, decode_offload_manager=None, metrics_collector=_Quiet(),
        metrics_reporter=_Metrics(), draft_worker=worker.draft_worker, model_worker=worker,
        logprob_result_processor=logprobs, output_streamer=_Quiet(), beam_coordinator=_Quiet(),
        abort_request=_Quiet().abort_request,
    )  # fmt: skip


class OverlapLoop:
    """The overlap event loop around a spec-v2 worker (Scheduler.event_loop_overlap, run_batch, the
    output processing), for batches the test schedules itself.

    `run` is run_batch's overlap branch for speculative batches: the FutureMap's seq-lens and
    spec-extras resolution, Scheduler._forward_isolation (its forward copy of the sampling info;
    overlap=False only skips its pinning of GPU tensors for the overlap window, moot on CPU), the
    worker's forward_batch_generation with on_publish, the relay, and the next draft input left on
    the batch. The step before's result is processed after this step's launch, as the loop does:
    prepare_decode of step N + 1 runs before N's tokens reach the requests; `flush` processes what
    is left. Needs `use_torch_kernels` active.
    """

    def __init__(self, pools: Pools, worker: Any):
        self.pools, self.worker = pools, worker
        self.pending: Optional[tuple[ScheduleBatch, Any]] = None

    def prefill(self, reqs: Sequence[Req]) -> ScheduleBatch:
        """A prefill batch as get_new_batch_prefill builds it, run."""
        batch = prefill_batch(self.pools, reqs)
        self.run(batch)
        return batch

    def prepare_decode(self, batch: ScheduleBatch) -> None:
        """update_running_batch's decode preparation (eagle_prepare_for_decode reserves KV ahead)."""
        if not batch.check_decode_mem():
            raise AssertionError("the KV pool cannot hold the decode reservation; raise max_tokens")
        batch.prepare_for_decode()

    def run(self, batch: ScheduleBatch) -> Any:
        from sglang.srt.managers.scheduler import Scheduler

        resolve_inputs(self.pools, batch)
        future_indices = batch.req_pool_indices
        with Scheduler._forward_isolation(None, batch, overlap=False):
            on_publish = partial(self.pools.future_map.publish, future_indices)
            result = self.worker.forward_batch_generation(batch, on_publish=on_publish)
            relay(self.pools, batch, future_indices, result)
        carry_next_draft(batch, result.next_draft_input, future_indices)
        previous, self.pending = self.pending, (batch.copy(), result)
        if previous is not None:
            self._process(*previous)
        return result

    def flush(self) -> None:
        if self.pending is not None:
            previous, self.pending = self.pending, None
            self._process(*previous)

    def _process(self, batch: ScheduleBatch, result: Any) -> None:
        processor = result_processor(self.pools, self.worker)
        if batch.forward_mode.is_extend():
            processor.process_batch_result_prefill(batch, result)
        else:
            processor.process_batch_result_decode(batch, result)


def spec_v2_server(tmp_path: Path, monkeypatch: Any, **server_overrides: Any) -> SimpleNamespace:
    """One rank of an EAGLE-3 spec-v2 server on CPU: its args and pools, the v2 worker around
    stood-in models (`model` plans the target's logits), the overlap loop and a word tokenizer,
    with the kernels on the decode and verify paths as torch references."""
    model_path = write_tiny_llama_config(tmp_path / "model")
    server_args = make_server_args(model_path, **server_overrides)
    use_torch_kernels(monkeypatch)
    use_torch_verify(monkeypatch)
    init_single_rank_groups()
    pools = make_pools(server_args)
    model = PlannedLogits()
    target, draft = StandInTarget(pools, server_args, model), StandInDraft()
    worker = spec_worker(target, draft, pools, server_args)
    return SimpleNamespace(
        server_args=server_args, pools=pools, model=model, target=target, draft=draft, worker=worker,
        loop=OverlapLoop(pools, worker), tokenizer=word_tokenizer(tmp_path / "tokenizer"),
    )  # fmt: skip
