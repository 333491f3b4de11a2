"""Real SGLang 0.5.23 scheduler objects on CPU, and torch references for the triton kernels they launch.

Everything here is SGLang's own code (runtime context, pools, allocator, prefix cache, FutureMap, Req,
ScheduleBatch, SamplingBatchInfo, EagleDraftInput), except the triton kernels, which cannot launch
without a GPU: `use_torch_kernels` swaps each one, where SGLang's modules look it up, for a torch
loop computing the same thing. SGLang is imported inside the functions: conftest puts the tree on
sys.path first.
"""

from __future__ import annotations

import dataclasses
import json
from array import array
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence

import torch

if TYPE_CHECKING:  # annotations only: SGLang is importable once conftest has set sys.path
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.server_args import ServerArgs

HIDDEN = 64
VOCAB = 512
NUM_LAYERS = 8
TOPK = 1


def write_tiny_llama_config(path: Path) -> Path:
    """A local HF config, so ModelConfig is the real class without any download."""
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float32",
        "hidden_size": HIDDEN, "intermediate_size": 4 * HIDDEN, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": NUM_LAYERS, "vocab_size": VOCAB,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "eos_token_id": 2, "bos_token_id": 1,
    }  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    return path


def make_server_args(model_path: Path, **overrides: Any) -> ServerArgs:
    """The ServerArgs of a CPU EAGLE-3 server, published as the scheduler's runtime context.

    0.5.23 resolves the arguments when they are published (as a launcher does) and the scheduler
    objects read the resolved bags (get_spec(), get_schedule(), get_exec(), ...).
    """
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    settings = {
        "model_path": str(model_path), "device": "cpu", "page_size": 1,
        # SGLang's own non-triton path for writing req_to_token at prefill (write_cache_indices).
        "attention_backend": "torch_native", "disable_radix_cache": True,
        "speculative_algorithm": "EAGLE3", "speculative_num_steps": 3,
        "speculative_eagle_topk": TOPK, "speculative_num_draft_tokens": 4,
    }  # fmt: skip
    args = ServerArgs(**{**settings, **overrides})
    set_global_server_args_for_scheduler(args)
    return args


@dataclasses.dataclass
class Pools:
    """What the scheduler owns for one TP rank: config, pools, allocator, prefix cache, FutureMap."""

    model_config: Any
    req_to_token_pool: Any
    kv_pool: Any
    allocator: Any
    tree_cache: Any
    future_map: Any


def make_pools(server_args: ServerArgs, max_reqs: int = 64, max_tokens: int = 8192) -> Pools:
    """Real pools for the tiny config; the prefix cache is what create_tree_cache builds for
    --disable-radix-cache (0.5.23: a disabled UnifiedRadixCache)."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.overlap_utils import FutureMap
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    model_config = ModelConfig(server_args.model_path)
    req_to_token_pool = ReqToTokenPool(size=max_reqs, max_context_len=1024, device="cpu", enable_memory_saver=False)
    kv_pool = MHATokenToKVPool(
        size=max_tokens, page_size=1, dtype=torch.float32, head_num=2, head_dim=HIDDEN // 4,
        layer_num=NUM_LAYERS, device="cpu", enable_memory_saver=False, enable_alt_stream=False,
    )  # fmt: skip
    allocator = TokenToKVPoolAllocator(
        size=max_tokens, dtype=torch.float32, device="cpu", kvcache=kv_pool, need_sort=False
    )
    params = CacheInitParams(True, req_to_token_pool, allocator, page_size=1, is_eagle=True)  # disable=True
    ctx = TreeCacheBuildContext(
        server_args, params, is_hybrid_swa=False, is_hybrid_ssm=False, enable_hierarchical_cache=False,
        disable_radix_cache=True, tp_worker=None, model_config=model_config, tp_size=1, tp_rank=0, tp_group=None,
    )  # fmt: skip
    # needs_cpu_seq_lens: torch_native declares no opt-out, so the scheduler keeps the CPU mirror.
    future_map = FutureMap(torch.device("cpu"), SpeculativeAlgorithm.EAGLE3, req_to_token_pool, needs_cpu_seq_lens=True)
    return Pools(model_config, req_to_token_pool, kv_pool, allocator, create_tree_cache(ctx), future_map)


def make_req(
    rid: str, prompt_len: int, *, max_new_tokens: int = 64, stop_token_ids: Optional[List[int]] = None,
    sampling: Optional[dict] = None, return_logprob: bool = False, top_logprobs_num: int = 0, tokenizer: Any = None,
) -> Req:  # fmt: skip
    """A Req as the scheduler builds it from a TokenizedGenerateReqInput (input ids as array('q')).

    With a tokenizer (stop strings, min_new_tokens need one), the scheduler's: the request holds it.
    """
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=stop_token_ids, **(sampling or {}))
    params.normalize(tokenizer)
    params.verify(VOCAB)
    input_ids = array("q", [(7 * i + len(rid)) % (VOCAB - 10) + 10 for i in range(prompt_len)])
    logprobs = {"return_logprob": return_logprob, "top_logprobs_num": top_logprobs_num}
    req = Req(rid, "", input_ids, params, vocab_size=VOCAB, eos_token_ids={2}, **logprobs)
    req.tokenizer = tokenizer
    return req


def _admit(pools: Pools, reqs: Sequence[Req]) -> None:
    """PrefillAdder's admission of whole prompts: match the prefix cache, extend to the end, lock."""
    for req in reqs:
        req.init_next_round_input(pools.tree_cache)
        req.extend_end = len(req.full_untruncated_fill_ids)  # _commit_prefill_admission, non-chunked
        req.lock = pools.tree_cache.lock(req.last_node)


def _finish_prefill(pools: Pools, batch: ScheduleBatch, first_tokens: Sequence[int]) -> None:
    """The overlap scheduler's run_batch + output processing of the prefill, minus the forward.

    What the v2 worker hands back is stood in for: its new_seq_lens (the prompt lengths: spec v2
    counts a length before the step's tokens) is published, and its next draft input is stashed,
    as Scheduler.run_batch / _relay_forward_payload do.
    """
    from sglang.srt.managers.overlap_utils import RelayPayload, resolve_forward_inputs
    from sglang.srt.mem_cache.common import checkpoint_kv_cache
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    fm, bs, future_indices = pools.future_map, len(batch.reqs), batch.req_pool_indices
    resolve_forward_inputs(batch, fm)  # the prompt tokens' H2D (prefill_input_ids_cpu -> input_ids)
    fm.publish(future_indices, batch.seq_lens)
    # Shapes/dtypes of _draft_extend_for_prefill's output: top-1 argmax ids, LAST hidden.
    draft = EagleDraftInput(
        topk_p=torch.full((bs, TOPK), 1.0 / TOPK), topk_index=torch.arange(TOPK).repeat(bs, 1) + 10,
        hidden_states=torch.randn(bs, HIDDEN), num_tokens_per_req=1, num_tokens_for_logprob_per_req=1,
        bonus_tokens=torch.tensor(first_tokens, dtype=torch.int32),  # the sampler's next_token_ids
    )  # fmt: skip
    fm.stash(future_indices, RelayPayload.from_draft_input(draft))
    batch.input_ids = None  # next iteration's input ids are relayed through the FutureMap
    batch.spec_info, draft.future_indices = draft, future_indices
    for req, token in zip(batch.reqs, first_tokens, strict=True):
        req.output_ids.append(token)
        req.update_finish_state()
        if req.finished():
            raise AssertionError(f"{req.rid} finished at its first token; the decode batch needs it running")
        checkpoint_kv_cache(req, pools.tree_cache)


def _resolve_decode_inputs(pools: Pools, batch: ScheduleBatch) -> None:
    """run_batch's resolution before the worker call: seq lens, spec extras, forward-only sampling."""
    from sglang.srt.managers.overlap_utils import resolve_forward_inputs

    pools.future_map.resolve_seq_lens_cpu(batch)  # seq_lens = new_seq_lens_buf[fi], CPU mirror, sum
    resolve_forward_inputs(batch, pools.future_map)  # spec extras: bonus tokens, top-k, hidden
    # Scheduler._forward_isolation hands the worker a copy without the penalizer orchestrator.
    batch.sampling_info = batch.sampling_info.copy_for_forward()


def _check_decode_state(pools: Pools, batch: ScheduleBatch, committed: List[int]) -> None:
    """Fail loudly where a wrong set-up would let a test pass: lengths, reserved slots, draft input."""
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_reserve_per_decode

    reserve, r2t = get_alloc_reserve_per_decode(), pools.req_to_token_pool.req_to_token
    checks = {
        "seq_lens": (batch.seq_lens.tolist(), committed),
        "seq_lens_cpu": (batch.seq_lens_cpu.tolist(), committed),
        "seq_lens_sum": (batch.seq_lens_sum, sum(committed)),
        "kv_committed_len": ([r.kv.kv_committed_len for r in batch.reqs], committed),
        "kv_allocated_len": ([r.kv.kv_allocated_len for r in batch.reqs], [s + reserve for s in committed]),
        "bonus_tokens": (batch.spec_info.bonus_tokens.tolist(), [r.output_ids[-1] for r in batch.reqs]),
    }
    for name, (got, want) in checks.items():
        if got != want:
            raise AssertionError(f"decode batch {name} is {got}, expected {want}")
    slots = torch.cat([r2t[r.kv.req_pool_idx, : r.kv.kv_allocated_len] for r in batch.reqs])
    if bool((slots <= 0).any()) or slots.unique().numel() != slots.numel():
        raise AssertionError("req_to_token rows up to kv_allocated_len must hold distinct, allocated KV slots")


def spec_v2_decode_batch(pools: Pools, reqs: Sequence[Req], first_tokens: Sequence[int]) -> ScheduleBatch:
    """A speculative decode batch as 0.5.23's overlap scheduler holds it at the v2 worker's
    forward_batch_generation for the first decode step after prefill.

    Admission, prefill, FutureMap publish/stash, output processing, then update_running_batch's
    check_decode_mem + prepare_for_decode (eagle_prepare_for_decode: reserves KV ahead), then
    run_batch's FutureMap resolution. batch.seq_lens = length BEFORE this step's token (the bonus
    token's KV is written by the verify forward). As in the scheduler, input_ids is None and
    out_cache_loc is still the prefill's (eagle_prepare_for_decode writes the reserved slots into
    req_to_token only; the worker's draft sets its own). Needs `use_torch_kernels` active.
    """
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    _admit(pools, reqs)
    batch = ScheduleBatch.init_new(
        list(reqs), pools.req_to_token_pool, pools.allocator, pools.tree_cache, pools.model_config,
        enable_overlap=True, spec_algorithm=SpeculativeAlgorithm.EAGLE3,
    )  # fmt: skip
    batch.prepare_for_extend()  # also builds sampling_info (SamplingBatchInfo.from_schedule_batch)
    committed = [len(r.origin_input_ids) for r in reqs]
    if batch.seq_lens.tolist() != committed:
        raise AssertionError(f"the prefill left seq_lens {batch.seq_lens.tolist()} for prompts of {committed}")
    _finish_prefill(pools, batch, first_tokens)
    if not batch.check_decode_mem():
        raise AssertionError("the KV pool cannot hold the decode reservation; raise max_tokens")
    batch.prepare_for_decode()
    _resolve_decode_inputs(pools, batch)
    _check_decode_state(pools, batch, committed)
    return batch


def model_runner_for_forward_batch(pools: Pools, server_args: ServerArgs) -> ModelRunner:
    """A ModelRunner without __init__ (no model, no GPU), holding what ForwardBatch.init_new reads:

    device, server_args and model_config; is_draft_worker; the pools, and the KV index translator
    over them (0.5.23 binds a KV location plan to every forward batch); the n-gram embedding and
    LoRA managers (off).
    init_new also reads get_parallel(): call init_single_rank_groups() first.
    """
    from types import SimpleNamespace

    from sglang.srt.model_executor.model_runner import ModelRunner

    runner = object.__new__(ModelRunner)
    runner.device, runner.server_args, runner.model_config = server_args.device, server_args, pools.model_config
    runner.is_draft_worker, runner.lora_manager = False, None
    runner.ngram_embedding_manager = SimpleNamespace(enabled=False)
    runner.token_to_kv_pool, runner.req_to_token_pool = pools.kv_pool, pools.req_to_token_pool
    runner.token_to_kv_pool_allocator, runner.page_size = pools.allocator, 1
    runner.init_kv_index_translator()  # SGLang's own, as ModelRunner.__init__ calls it
    return runner


# ---- torch references for the triton kernels on these paths --------------------------------


class Launcher:
    """`kernel[grid](*args)` calls `fn(*args)`, like a triton JIT function."""

    def __init__(self, fn: Callable[..., None]):
        self.fn = fn

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return self.fn


def _assign_req_to_token_pool(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, *_constexprs):
    # Program i writes req_to_token[pool_idx_i, start_i:end_i] from out_cache_loc, starting at
    # the sum of the earlier requests' (end - start).
    pt = 0
    for i in range(req_pool_indices.numel()):
        start, end = int(start_offset[i]), int(end_offset[i])
        req_to_token[req_pool_indices[i], start:end] = out_cache_loc[pt : pt + end - start].to(req_to_token.dtype)
        pt += end - start


def _gather_spec_extras(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf):
    # One fused launch gathering the same rows of each buffer (hidden states only when captured).
    hidden = None if hidden_states_buf is None else hidden_states_buf[indices]
    return topk_p_buf[indices], topk_index_buf[indices], output_tokens_buf[indices], hidden


def use_torch_kernels(monkeypatch) -> None:
    """Swap the triton kernels these paths launch for the torch references above, where looked up:

    mem_cache.allocation's assign_req_to_token_pool (alloc_for_spec_decode's req_to_token write;
    its CPU branch is a native sgl_kernel op, off unless SGLANG_USE_CPU_ENGINE=1) and
    overlap_utils' gather_spec_extras (FutureMap's spec-extras resolution).
    """
    import sglang.srt.managers.overlap_utils as overlap_utils
    import sglang.srt.mem_cache.allocation as allocation

    monkeypatch.setattr(allocation, "assign_req_to_token_pool", Launcher(_assign_req_to_token_pool))
    monkeypatch.setattr(overlap_utils, "gather_spec_extras", _gather_spec_extras)


def init_single_rank_groups() -> None:
    """SGLang's own process groups for one rank (gloo), as a TP1 server sets them up.

    ForwardBatch.init_new needs them: it reads get_parallel() (MoE-EP, attention-DP groups).
    """
    import socket

    from sglang.srt.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    parallel_state.init_distributed_environment(
        world_size=1, rank=0, local_rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo"
    )
    parallel_state.initialize_model_parallel(backend="gloo")


class OverlapLoop:
    """0.5.23's overlap event loop around a speculative v2 worker (Scheduler.event_loop_overlap,
    run_batch, output processing), for batches the test schedules itself.

    `run` is run_batch's overlap branch for speculative batches: the FutureMap's seq-lens and
    spec-extras resolution, Scheduler._forward_isolation (its forward copy of the sampling info;
    overlap=False only skips its pinning of GPU tensors for the overlap window, moot on CPU),
    the worker's forward_batch_generation with on_publish, Scheduler._relay_forward_payload, and
    the next draft input left on the batch. The step before's result is processed after this
    step's launch, as the loop does: prepare_for_decode of step N + 1 runs before N's tokens reach
    the requests. Decode results go through SchedulerBatchResultProcessor._resolve_spec_v2_tokens.
    Needs `use_torch_kernels` active.
    """

    def __init__(self, pools: Pools, worker: Any):
        self.pools, self.worker = pools, worker
        self.pending: Optional[tuple[ScheduleBatch, Any]] = None

    def admit_prefill(self, reqs: Sequence[Req]) -> ScheduleBatch:
        """A prefill batch as get_new_batch_prefill builds it (admission, prepare_for_extend)."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        _admit(self.pools, reqs)
        batch = ScheduleBatch.init_new(
            list(reqs), self.pools.req_to_token_pool, self.pools.allocator, self.pools.tree_cache,
            self.pools.model_config, enable_overlap=True, spec_algorithm=SpeculativeAlgorithm.EAGLE3,
        )  # fmt: skip
        batch.prepare_for_extend()
        return batch

    def run(self, batch: ScheduleBatch):
        from types import SimpleNamespace

        from sglang.srt.managers.overlap_utils import resolve_forward_inputs
        from sglang.srt.managers.scheduler import Scheduler

        fm = self.pools.future_map
        fm.resolve_seq_lens_cpu(batch)
        resolve_forward_inputs(batch, fm)
        with Scheduler._forward_isolation(None, batch, overlap=False):
            future_indices = batch.req_pool_indices
            result = self.worker.forward_batch_generation(
                batch, on_publish=lambda lens: fm.publish(future_indices, lens)
            )
            scheduler = SimpleNamespace(
                spec_algorithm=batch.spec_algorithm, future_map=fm, chunked_req=None,
                beam_coordinator=SimpleNamespace(maybe_select_and_relay=lambda *args, **kwargs: None),
            )  # fmt: skip
            Scheduler._relay_forward_payload(scheduler, batch, future_indices, result)
        batch.input_ids = None
        batch.spec_info = result.next_draft_input
        batch.spec_info.future_dsa_topk_indices_available = batch.spec_info.dsa_topk_indices is not None
        batch.spec_info.future_indices = future_indices
        previous, self.pending = self.pending, (batch.copy(), result)
        if previous is not None:
            self._process(*previous)
        return result

    def flush(self) -> None:
        if self.pending is not None:
            self._process(*self.pending)
            self.pending = None

    def _process(self, batch: ScheduleBatch, result) -> None:
        from types import SimpleNamespace

        from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor
        from sglang.srt.mem_cache.common import checkpoint_kv_cache

        if batch.forward_mode.is_extend():
            for req, token in zip(batch.reqs, result.next_token_ids.tolist(), strict=True):
                req.output_ids.append(token)
                req.update_finish_state()
                checkpoint_kv_cache(req, self.pools.tree_cache)
            return
        processor = SimpleNamespace(
            metrics_reporter=SimpleNamespace(snapshot_spec_decode_metrics=lambda *args: None),
            model_worker=SimpleNamespace(on_verify_complete_cpu=lambda *args, **kwargs: None),
            advance_grammar_fsm=lambda *args: None,
        )  # fmt: skip
        for req, tokens in zip(
            batch.reqs, SchedulerBatchResultProcessor._resolve_spec_v2_tokens(processor, result, batch), strict=True
        ):
            if req.finished():
                continue
            req.output_ids.extend(tokens)
            req.update_finish_state(len(tokens))
