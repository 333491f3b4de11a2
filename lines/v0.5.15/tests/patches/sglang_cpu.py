"""Real SGLang 0.5.15 scheduler objects on CPU, and torch references for the triton kernels they launch.

Everything here is SGLang's own code (pools, allocator, FutureMap, Req, ScheduleBatch,
SamplingBatchInfo, EagleDraftInput), except the triton kernels, which cannot launch without a GPU:
`use_torch_kernels` swaps each one, where SGLang's modules look it up, for a torch loop computing
the same thing. SGLang is imported inside the functions: conftest puts the tree on sys.path first.
"""

from __future__ import annotations

import dataclasses
import json
from array import array
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence

import kernel_refs
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


def server_args_with_defaults(**overrides: Any) -> ServerArgs:
    """A ServerArgs holding its field defaults, without __post_init__'s GPU probing.

    Every field is set on the instance: 0.5.15's runtime context resolves its flags
    (`get_flags().attn.backend`, page_size, ...) from instance fields, and treats an instance
    without them as a field-less sentinel.
    """
    from sglang.srt.server_args import ServerArgs

    args = object.__new__(ServerArgs)
    for field in dataclasses.fields(ServerArgs):
        factory = field.default_factory
        default = field.default if factory is dataclasses.MISSING else factory()
        setattr(args, field.name, None if default is dataclasses.MISSING else default)
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def make_server_args(model_path: Path, **overrides: Any) -> ServerArgs:
    """The global ServerArgs the scheduler objects read, set up for a CPU EAGLE-3 (spec v2) batch."""
    from sglang.srt.server_args import set_global_server_args_for_scheduler

    settings = {
        "model_path": str(model_path), "device": "cpu", "page_size": 1,
        # SGLang's own non-triton path for writing req_to_token at prefill (write_cache_indices).
        "attention_backend": "torch_native",
        "speculative_algorithm": "EAGLE3", "speculative_num_steps": 3,
        "speculative_eagle_topk": TOPK, "speculative_num_draft_tokens": 4,
    }  # fmt: skip
    args = server_args_with_defaults(**{**settings, **overrides})
    # Publishing resolves the flags from these fields; set them before, not after.
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


def make_pools(model_path: Path, max_reqs: int = 64, max_tokens: int = 8192) -> Pools:
    """Real pools for the tiny config; ChunkCache(is_eagle) is the prefix cache of --disable-radix-cache."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.overlap_utils import FutureMap
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.chunk_cache import ChunkCache
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    model_config = ModelConfig(str(model_path))
    req_to_token_pool = ReqToTokenPool(size=max_reqs, max_context_len=1024, device="cpu", enable_memory_saver=False)
    kv_pool = MHATokenToKVPool(
        size=max_tokens, page_size=1, dtype=torch.float32, head_num=2, head_dim=HIDDEN // 4,
        layer_num=NUM_LAYERS, device="cpu", enable_memory_saver=False, enable_alt_stream=False,
    )  # fmt: skip
    allocator = TokenToKVPoolAllocator(
        size=max_tokens, dtype=torch.float32, device="cpu", kvcache=kv_pool, need_sort=False
    )
    params = CacheInitParams(True, req_to_token_pool, allocator, page_size=1, is_eagle=True)  # disable=True
    # needs_cpu_seq_lens: torch_native declares no opt-out, so the scheduler keeps the CPU mirror.
    future_map = FutureMap(torch.device("cpu"), SpeculativeAlgorithm.EAGLE3, req_to_token_pool, needs_cpu_seq_lens=True)
    return Pools(model_config, req_to_token_pool, kv_pool, allocator, ChunkCache(params), future_map)


def make_req(
    rid: str, prompt_len: int, *, max_new_tokens: int = 64, stop_token_ids: Optional[List[int]] = None,
    sampling: Optional[dict] = None, return_logprob: bool = False, top_logprobs_num: int = 0, tokenizer: Any = None,
) -> Req:  # fmt: skip
    """A Req as the scheduler builds it from a TokenizedGenerateReqInput (input ids as array('q'));
    stop strings and min_new_tokens need a tokenizer (see word_tokenizer)."""
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


def _finish_prefill(pools: Pools, batch: ScheduleBatch, first_tokens: Sequence[int]) -> None:
    """The overlap scheduler's run_batch + output processing of the prefill, minus the forward.

    What the v2 worker hands back is stood in for: its new_seq_lens (the prompt lengths: spec v2
    counts a length before the step's tokens) is published, and its next draft input is stashed,
    as Scheduler.run_batch / _relay_forward_payload do.
    """
    from sglang.srt.managers.overlap_utils import RelayPayload, resolve_forward_inputs
    from sglang.srt.mem_cache.common import maybe_cache_unfinished_req
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    fm, bs, future_indices = pools.future_map, len(batch.reqs), batch.req_pool_indices
    resolve_forward_inputs(batch, fm)  # the prompt tokens' H2D (prefill_input_ids_cpu -> input_ids)
    fm.publish(future_indices, batch.seq_lens)
    # Shapes/dtypes of _draft_extend_for_prefill's output: fast_topk over float32 probs, LAST hidden.
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
        maybe_cache_unfinished_req(req, pools.tree_cache)


def _resolve_decode_inputs(pools: Pools, batch: ScheduleBatch) -> None:
    """run_batch's resolution before the worker call: seq lens, spec extras, forward-only sampling.

    FutureMap._resolve_spec_extras is not called: its `indices.record_stream(...)` has no CPU
    stream. Its result is read from the same FutureMap buffers (gather_spec_extras is a row gather).
    """
    fm = pools.future_map
    fm.resolve_seq_lens_cpu(batch)  # seq_lens = new_seq_lens_buf[fi], then its CPU mirror and sum
    draft, fi = batch.spec_info, batch.spec_info.future_indices
    draft.topk_p, draft.topk_index = fm.topk_p_buf[fi], fm.topk_index_buf[fi]
    draft.bonus_tokens, draft.hidden_states = fm.output_tokens_buf[fi], fm.hidden_states_buf[fi]
    # Scheduler._forward_isolation hands the worker a copy without the penalizer orchestrator.
    batch.sampling_info = batch.sampling_info.copy_for_forward()


def _check_decode_state(pools: Pools, batch: ScheduleBatch, committed: List[int]) -> None:
    """Fail loudly where a wrong set-up would let a test pass: lengths, reserved slots, draft input."""
    from sglang.srt.mem_cache.common import get_alloc_reserve_per_decode

    reserve, r2t = get_alloc_reserve_per_decode(), pools.req_to_token_pool.req_to_token
    checks = {
        "seq_lens": (batch.seq_lens.tolist(), committed),
        "seq_lens_cpu": (batch.seq_lens_cpu.tolist(), committed),
        "seq_lens_sum": (batch.seq_lens_sum, sum(committed)),
        "kv_committed_len": ([r.kv_committed_len for r in batch.reqs], committed),
        "kv_allocated_len": ([r.kv_allocated_len for r in batch.reqs], [s + reserve for s in committed]),
        "bonus_tokens": (batch.spec_info.bonus_tokens.tolist(), [r.output_ids[-1] for r in batch.reqs]),
    }
    for name, (got, want) in checks.items():
        if got != want:
            raise AssertionError(f"decode batch {name} is {got}, expected {want}")
    slots = torch.cat([r2t[r.req_pool_idx, : r.kv_allocated_len] for r in batch.reqs])
    if bool((slots <= 0).any()) or slots.unique().numel() != slots.numel():
        raise AssertionError("req_to_token rows up to kv_allocated_len must hold distinct, allocated KV slots")


def spec_v2_decode_batch(pools: Pools, reqs: Sequence[Req], first_tokens: Sequence[int]) -> ScheduleBatch:
    """A speculative decode batch as 0.5.15's overlap scheduler holds it at the v2 worker's
    forward_batch_generation for the first decode step after prefill.

    Prefill, FutureMap publish/stash, output processing, then update_running_batch's
    check_decode_mem + prepare_for_decode (eagle_prepare_for_decode: reserves KV ahead), then
    run_batch's FutureMap resolution. batch.seq_lens = length BEFORE this step's token (the bonus
    token's KV is written by the verify forward). As in the scheduler, input_ids is None and
    out_cache_loc is still the prefill's (eagle_prepare_for_decode writes the reserved slots into
    req_to_token only; the worker's draft sets its own). Needs `use_torch_kernels` active.
    """
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    for req in reqs:
        req.init_next_round_input(pools.tree_cache)
        # PrefillAdder.add_one_req, non-chunked: the whole unmatched fill is this prefill's range.
        req.set_extend_range(len(req.prefix_indices), len(req.full_untruncated_fill_ids))
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

    device (tensors it builds), server_args (attention_backend for extend positions, enable_lora),
    use_ngram_embedding and model_is_mrope (position/embedding branches; computed from the config
    as ModelRunner.__init__ does), model_config (for callers that read it next to the batch).
    init_new also reads get_parallel().moe_ep_size: call init_single_rank_groups() first.
    """
    from sglang.srt.model_executor.model_runner import ModelRunner

    runner = object.__new__(ModelRunner)
    runner.device, runner.server_args, runner.model_config = server_args.device, server_args, pools.model_config
    runner.use_ngram_embedding = pools.model_config.use_ngram_embedding
    hf = pools.model_config.hf_text_config  # rope_scaling as ModelRunner.__init__ reads it
    rope_scaling = getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", {})
    runner.model_is_mrope = rope_scaling is not None and "mrope_section" in rope_scaling
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


def _assign_extend_cache_locs(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, *_constexprs):
    # The reverse gather: out_cache_loc, at the same running offset, takes request i's slots
    # req_to_token[pool_idx_i, start_i:end_i].
    pt = 0
    for i in range(req_pool_indices.numel()):
        start, end = int(start_offset[i]), int(end_offset[i])
        out_cache_loc[pt : pt + end - start] = req_to_token[req_pool_indices[i], start:end]
        pt += end - start


def _assign_draft_cache_locs_contiguous(
    req_pool_indices, req_to_token, seq_lens, out_cache_loc, _pool_len, topk, steps
):
    # Program i copies topk*steps slots of req_to_token from position seq_len_i into
    # out_cache_loc[i*topk*steps:], the draft steps' write targets.
    n = topk * steps
    for i in range(req_pool_indices.numel()):
        s = int(seq_lens[i])
        out_cache_loc[i * n : (i + 1) * n] = req_to_token[req_pool_indices[i], s : s + n]


def use_torch_kernels(monkeypatch) -> None:
    """Swap the cache-location triton kernels for the torch references above, where looked up at launch:

    in cache_locs, for its wrappers assign_req_to_token_pool_func / assign_extend_cache_locs_func (which
    every importer - eagle_utils, spec_utils, ngram_worker, dflash_* - calls into) and for
    base_spec_worker's lazy import; in spec_utils, whose move_accept_tokens launches its re-export.
    """
    import sglang.srt.speculative.spec_utils as spec_utils
    import sglang.srt.speculative.triton_ops.cache_locs as cache_locs

    for fn in (_assign_req_to_token_pool, _assign_extend_cache_locs, _assign_draft_cache_locs_contiguous):
        name = fn.__name__.lstrip("_")
        monkeypatch.setattr(cache_locs, name, Launcher(fn))
        if hasattr(spec_utils, name):
            monkeypatch.setattr(spec_utils, name, Launcher(fn))
    # assign_extend_cache_locs_func has no CPU branch (it returns None there); take its CUDA
    # branch, which allocates the int64 result and launches the kernel replaced above.
    monkeypatch.setattr(cache_locs, "_is_cuda", True)


def init_single_rank_groups() -> None:
    """SGLang's own process groups for one rank (gloo), as a TP1 server sets them up.

    ForwardBatch.init_new needs them: it reads get_parallel().moe_ep_size (the MoE-EP group).
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


# ---- the v2 worker's steps under the overlap scheduler's bookkeeping -----------------------


def word_tokenizer(path: Path):
    """A word-level tokenizer through SGLang's get_tokenizer (kernel_refs): token i is `w<i>`, EOS `w2`."""
    return kernel_refs.word_tokenizer(path, VOCAB)


def verify_tree_greedy(
    predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
    retrive_next_sibling, target_predict,
):  # fmt: skip
    """sgl_kernel.verify_tree_greedy, with the argument names SGLang 0.5.15 passes."""
    kernel_refs.greedy_tree_walk(
        predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
        retrive_next_sibling, target_predict,
    )  # fmt: skip


def _fill_bonus_tokens(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    # Program i stores accept_tokens[i * stride + accept_lens[i] - 1], the last accepted token.
    flat = accept_tokens.reshape(-1)
    for i in range(accept_lens.numel()):
        bonus_tokens[i] = flat[accept_stride * i + int(accept_lens[i]) - 1]


def _fill_accept_out_cache_loc(accept_index, out_cache_loc, accept_out_cache_loc, _size_upper):
    # Program i, for an accepted entry i of the flat accept_index, stores its KV slot at the
    # number of accepted entries before it: the accepted path's slots, packed.
    flat = accept_index.reshape(-1)
    for i in range(flat.numel()):
        if int(flat[i]) > -1:
            accept_out_cache_loc[int((flat[:i] != -1).sum())] = out_cache_loc[flat[i]]


def use_torch_verify(monkeypatch) -> None:
    """The greedy verify's native kernel (sgl_kernel.verify_tree_greedy, reached on CUDA only) and
    the triton kernels after it (the worker's fill_bonus_tokens; for trees, the accepted path's
    KV move), as the torch references above."""
    import sgl_kernel
    import sglang.srt.speculative.eagle_utils as eagle_utils
    import sglang.srt.speculative.eagle_worker_v2 as eagle_worker_v2
    import sglang.srt.speculative.spec_utils as spec_utils

    monkeypatch.setattr(eagle_utils, "_is_cuda", True)
    monkeypatch.setattr(sgl_kernel, "verify_tree_greedy", verify_tree_greedy, raising=False)
    monkeypatch.setattr(eagle_worker_v2, "fill_bonus_tokens", Launcher(_fill_bonus_tokens))
    monkeypatch.setattr(spec_utils, "fill_accept_out_cache_loc", Launcher(_fill_accept_out_cache_loc))


def verify_input(draft_tokens: torch.Tensor, seq_lens: torch.Tensor, next_token=None, next_sibling=None, topk: int = 1):
    """The EagleVerifyInput a draft builds: per request the tree rooted at column 0 of draft_tokens
    [bs, D] (the pending token); next_token/next_sibling [D] give its shape, by default a chain."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    bs, num_draft = draft_tokens.shape
    local = torch.arange(num_draft)
    if next_token is None:
        next_token = torch.where(local + 1 < num_draft, local + 1, -1).tolist()
        next_sibling = [-1] * num_draft
    depth = 0
    node = 0
    while next_token[node] != -1:  # the first-child chain is the tree's depth
        node, depth = next_token[node], depth + 1
    return EagleVerifyInput(
        draft_token=draft_tokens.reshape(-1).clone(),
        custom_mask=torch.ones(int(seq_lens.sum()) * num_draft + bs * num_draft * num_draft, dtype=torch.bool),
        positions=(seq_lens.unsqueeze(1) + local).reshape(-1), retrieve_index=torch.arange(bs).unsqueeze(1) * num_draft + local,
        retrieve_next_token=torch.tensor([next_token] * bs), retrieve_next_sibling=torch.tensor([next_sibling] * bs),
        retrieve_cum_len=None, spec_steps=depth, topk=topk, draft_token_num=num_draft,
        capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=int(seq_lens.sum()), seq_lens_cpu=seq_lens.cpu(),
    )  # fmt: skip


class StandInTarget:
    """The target worker, stood in for: it builds the ForwardBatch as the real worker does
    (ForwardBatch.init_new, SGLang's own) and returns the logits `logits_fn(forward_batch)`; where
    the real worker samples (prefill, plain decode), it runs ModelRunner's own logits
    preprocessing (the penalties) and takes the greedy pick. `seen` keeps each call's forward
    batch, raw logits and the logits tensor it returned (which the verify penalises in place)."""

    def __init__(self, pools: Pools, server_args: ServerArgs, logits_fn):
        from sglang.srt.model_executor import model_runner as model_runner_module
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        runner = model_runner_for_forward_batch(pools, server_args)
        # What ModelRunner.__init__ sets that the worker's paths read: the model's linear-attention
        # layout (from its config), pools, no graphs, the attention backend's verify buffers.
        runner.is_draft_worker = False
        runner._linear_attn_registry_cache = model_runner_module._UNSET
        runner.req_to_token_pool, runner.token_to_kv_pool = pools.req_to_token_pool, pools.kv_pool
        runner.decode_cuda_graph_runner = None
        runner.spec_algorithm = SpeculativeAlgorithm.EAGLE3
        runner.war_fastpath_read_done_event = None
        runner.attn_backend = type(
            "Backend", (), {"get_verify_buffers_to_fill_after_draft": lambda self: (None, None)}
        )()
        self.model_runner, self.logits_fn = runner, logits_fn
        self.seen: list[tuple[Any, torch.Tensor, torch.Tensor]] = []

    def forward_batch_generation(self, batch=None, forward_batch=None, is_verify=False):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch

        if forward_batch is None:
            forward_batch = ForwardBatch.init_new(batch, self.model_runner)
        logits = self.logits_fn(forward_batch)
        self.seen.append((forward_batch, logits.clone(), logits))
        # EAGLE-3 captures three target layers: the draft extend reads [rows, 3 * hidden].
        output = LogitsProcessorOutput(next_token_logits=logits, hidden_states=torch.ones(logits.shape[0], 3 * HIDDEN))
        result = GenerationBatchResult(logits_output=output, can_run_cuda_graph=False)
        if not is_verify:
            self.model_runner._preprocess_logits(output, forward_batch.sampling_info)
            result.next_token_ids = logits.argmax(-1)
        return result


class StandInDraft:
    """The draft worker, stood in for: `draft` returns the verify input the test chose, the draft
    extends fill the next draft input with the shapes and dtypes the FutureMap relays."""

    def __init__(self):
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        model_config = type("ModelConfig", (), {"spec_hidden_size": HIDDEN, "dtype": torch.float32})()
        self.draft_runner = type("Runner", (), {"tp_group": None, "spec_algorithm": SpeculativeAlgorithm.EAGLE3,
                                                "war_fastpath_read_done_event": None, "model_config": model_config})()  # fmt: skip
        self.next_verify_input = None

    def draft_tp_context(self, _group):
        import contextlib

        return contextlib.nullcontext()

    def draft(self, batch):
        return self.next_verify_input(batch)

    def _draft_extend_for_prefill(self, batch, hidden_states, next_token_ids, mm_input_embeds=None):
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        bs = len(batch.reqs)
        return EagleDraftInput(
            topk_p=torch.full((bs, TOPK), 1.0 / TOPK), topk_index=torch.arange(TOPK).repeat(bs, 1) + 10,
            hidden_states=torch.randn(bs, HIDDEN), bonus_tokens=next_token_ids,
            num_tokens_per_req=1, num_tokens_for_logprob_per_req=1,
        )  # fmt: skip

    def _draft_extend_for_decode(self, batch, batch_result):
        draft_input, bs = batch_result.next_draft_input, batch.seq_lens.shape[0]
        draft_input.topk_p, draft_input.topk_index = torch.ones(bs, TOPK), torch.zeros(bs, TOPK, dtype=torch.int64) + 10
        draft_input.hidden_states = torch.randn(bs, HIDDEN)


def spec_worker(target: StandInTarget, draft: StandInDraft, pools: Pools, server_args: ServerArgs):
    """SGLang's EAGLEWorkerV2 (object.__new__) around the stand-ins, no adaptive controller."""
    import contextlib

    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    worker = object.__new__(EAGLEWorkerV2)
    worker._target_worker, worker._draft_worker = target, draft
    worker.adaptive_controller, worker.topk, worker.device = None, server_args.speculative_eagle_topk, "cpu"
    worker.speculative_num_steps = server_args.speculative_num_steps
    worker.speculative_num_draft_tokens = server_args.speculative_num_draft_tokens
    worker.plan_stream, worker.plan_stream_ctx = None, contextlib.nullcontext()
    worker.req_to_token_pool, worker.token_to_kv_pool_allocator = pools.req_to_token_pool, pools.allocator
    worker.speculative_algorithm = target.model_runner.spec_algorithm
    return worker


class OverlapScheduler:
    """What 0.5.15's overlap scheduler does around the worker, in its order, for one rank:
    run_batch (FutureMap resolution, the forward-only sampling-info copy of _forward_isolation,
    the publish/stash relay, the next draft input onto the batch), the decode preparation of
    get_next_batch_to_run, and the output processing of the previous batch, which the overlap
    loop runs only after launching the next one."""

    def __init__(self, pools: Pools, worker):
        self.pools, self.worker = pools, worker
        self.pending: list[tuple[ScheduleBatch, Any]] = []

    def prefill(self, reqs: Sequence[Req]) -> ScheduleBatch:
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        for req in reqs:
            req.init_next_round_input(self.pools.tree_cache)
            req.set_extend_range(len(req.prefix_indices), len(req.full_untruncated_fill_ids))
        batch = ScheduleBatch.init_new(
            list(reqs), self.pools.req_to_token_pool, self.pools.allocator, self.pools.tree_cache,
            self.pools.model_config, enable_overlap=True, spec_algorithm=SpeculativeAlgorithm.EAGLE3,
        )  # fmt: skip
        batch.prepare_for_extend()
        self.run(batch)
        return batch

    def prepare_decode(self, batch: ScheduleBatch) -> None:
        if not batch.check_decode_mem():
            raise AssertionError("the KV pool cannot hold the decode reservation; raise max_tokens")
        batch.prepare_for_decode()

    def run(self, batch: ScheduleBatch):
        from functools import partial

        from sglang.srt.managers.overlap_utils import RelayPayload, resolve_forward_inputs
        from sglang.srt.managers.scheduler import Scheduler

        fm = self.pools.future_map
        fm.resolve_seq_lens_cpu(batch)
        if batch.forward_mode.is_extend():
            resolve_forward_inputs(batch, fm)
        else:
            # FutureMap._resolve_spec_extras, whose `indices.record_stream` has no CPU stream: the
            # same row gather from the same buffers.
            draft, fi = batch.spec_info, batch.spec_info.future_indices
            draft.topk_p, draft.topk_index = fm.topk_p_buf[fi], fm.topk_index_buf[fi]
            draft.bonus_tokens, draft.hidden_states = fm.output_tokens_buf[fi], fm.hidden_states_buf[fi]
        future_indices = batch.req_pool_indices
        # Scheduler._forward_isolation itself; overlap=False only skips its 2-iteration pinning.
        with Scheduler._forward_isolation(None, batch, overlap=False):
            result = self.worker.forward_batch_generation(batch, on_publish=partial(fm.publish, future_indices))
        fm.stash(future_indices, RelayPayload.from_draft_input(result.next_draft_input))
        batch.input_ids = None
        batch.spec_info = result.next_draft_input
        batch.spec_info.future_indices = future_indices
        self.pending.append((batch.copy(), result))
        return result

    def process(self) -> None:
        """The oldest launched batch's output processing (SchedulerBatchResultProcessor's own)."""
        batch, result = self.pending.pop(0)
        processor = result_processor(self.pools, self.worker)
        if batch.forward_mode.is_extend():
            processor.process_batch_result_prefill(batch, result)
        else:
            processor.process_batch_result_decode(batch, result)


class _Quiet:
    """Metrics and streaming, which the output processor reports to: nothing to report here."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class _Metrics(_Quiet):
    num_generated_tokens = forward_ct_decode = 0


def result_processor(pools: Pools, worker):
    """The scheduler's SchedulerBatchResultProcessor on these pools, as Scheduler builds it for one
    overlap rank without disaggregation; metrics and streaming quiet."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor
    from sglang.srt.managers.scheduler_components.logprob_result_processor import SchedulerLogprobResultProcessor
    from sglang.srt.server_args import get_global_server_args

    server_args = get_global_server_args()
    return SchedulerBatchResultProcessor(
        is_generation=True, disaggregation_mode=DisaggregationMode.NULL, enable_overlap=True,
        enable_overlap_mlx=False, server_args=server_args, model_config=pools.model_config,
        token_to_kv_pool_allocator=pools.allocator, tree_cache=pools.tree_cache, hisparse_coordinator=None,
        req_to_token_pool=pools.req_to_token_pool, decode_offload_manager=None, metrics_collector=_Quiet(),
        metrics_reporter=_Metrics(), draft_worker=worker.draft_worker, model_worker=worker,
        logprob_result_processor=SchedulerLogprobResultProcessor(server_args=server_args, model_config=pools.model_config),
        output_streamer=_Quiet(), abort_request=_Quiet().abort_request,
    )  # fmt: skip


class PlannedLogits:
    """The stood-in target's logits: noise in [0, 1), with the planned next token 6 ahead at each row.

    `plan(forward_batch)` gives the favoured token of every row the target returns (one a request
    for a prefill or a decode, one a draft position for a verify)."""

    def __init__(self, seed: int = 0):
        self.plan = None
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, forward_batch):
        favoured = torch.as_tensor(self.plan(forward_batch))
        logits = torch.rand(len(favoured), VOCAB, generator=self.generator)
        logits[torch.arange(len(favoured)), favoured] += 6.0
        return logits


def spec_v2_server(tmp_path: Path, monkeypatch, **server_overrides: Any):
    """One rank of an EAGLE-3 spec-v2 server on CPU: pools, the v2 worker around stood-in models,
    the overlap scheduler's bookkeeping and a word tokenizer (attributes of the returned object)."""
    import types

    model_path = write_tiny_llama_config(tmp_path / "model")
    server_args = make_server_args(model_path, **server_overrides)
    use_torch_kernels(monkeypatch)
    use_torch_verify(monkeypatch)
    init_single_rank_groups()
    pools = make_pools(model_path)
    model = PlannedLogits()
    target, draft = StandInTarget(pools, server_args, model), StandInDraft()
    worker = spec_worker(target, draft, pools, server_args)
    return types.SimpleNamespace(
        pools=pools, model=model, target=target, draft=draft, worker=worker,
        scheduler=OverlapScheduler(pools, worker), tokenizer=word_tokenizer(tmp_path / "tokenizer"),
    )  # fmt: skip
