"""Real SGLang scheduler objects on CPU, for the patch tests of every release line.

Everything here is SGLang's own code (ServerArgs, pools, allocator, prefix cache, FutureMap, Req,
ScheduleBatch, SamplingBatchInfo, EagleDraftInput), except the kernels, which cannot run without a
GPU: `use_torch_kernels` swaps each triton kernel, where the imported release looks it up, for its
torch reference (kernel_refs). Where the releases build these objects differently, the one in use is
told apart by what its classes and modules have, not by its version number, so a line's tree at any
patch of its series gets the branch its code needs; each such place says which releases take which.
SGLang is imported inside the functions: conftest puts the tree on sys.path first.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
from array import array
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, List, Optional, Sequence

import kernel_refs
import torch
from kernel_refs import Launcher

if TYPE_CHECKING:  # annotations only: SGLang is importable once conftest has set sys.path
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.server_args import ServerArgs

HIDDEN = 64
VOCAB = 512
NUM_LAYERS = 8
TOPK = 1  # the v2 worker's draft on the lines without v1: a chain


def sglang_module(name: str) -> Optional[ModuleType]:
    """The module `name` of the imported SGLang, or None where its release has no such module."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name is None or not name.startswith(err.name):
            raise  # the module is there but fails to import: a real error
        return None


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
    without them as a field-less sentinel. Needs ServerArgs to be a dataclass (not 0.5.23's).
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


def _eagle3_shape() -> dict[str, int]:
    """The draft a test's server runs unless it says otherwise. Where the release still has the v1
    worker (0.5.9), its tests are written for v1's topk-4 tree of 16 tokens; from 0.5.13 on only
    the v2 worker is left, and the lines' tests run its topk-1 chain of steps + 1 tokens."""
    if sglang_module("sglang.srt.speculative.eagle_worker") is not None:
        return {"speculative_num_steps": 3, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 16}
    return {"speculative_num_steps": 3, "speculative_eagle_topk": TOPK, "speculative_num_draft_tokens": 4}


def make_server_args(model_path: Path, **overrides: Any) -> ServerArgs:
    """The ServerArgs of a CPU EAGLE-3 server, published as the scheduler's (overrides win).

    Where ServerArgs is a dataclass (0.5.9, 0.5.15) it holds the field defaults, so that no
    __post_init__ rewrites what a test sets; publishing resolves 0.5.15's flags from its fields, so
    all are set before. 0.5.23's ServerArgs is a msgspec Struct, which refuses a bare instance: it
    is built, and resolved when published, as a launcher does it.
    """
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    settings = {
        "model_path": str(model_path), "device": "cpu", "page_size": 1,
        # SGLang's own non-triton path for writing req_to_token at prefill.
        "attention_backend": "torch_native", "disable_radix_cache": True,
        "speculative_algorithm": "EAGLE3", **_eagle3_shape(), **overrides,
    }  # fmt: skip
    args = server_args_with_defaults(**settings) if dataclasses.is_dataclass(ServerArgs) else ServerArgs(**settings)
    set_global_server_args_for_scheduler(args)
    return args


@dataclasses.dataclass
class Pools:
    """What the scheduler owns for one TP rank: config, pools, allocator, prefix cache, and the
    FutureMap of the overlap scheduler's spec-v2 relay (None on 0.5.9, whose map is another)."""

    model_config: Any
    req_to_token_pool: Any
    kv_pool: Any
    allocator: Any
    tree_cache: Any
    future_map: Any = None


def make_pools(server_args: ServerArgs, max_reqs: int = 64, max_tokens: int = 8192) -> Pools:
    """Real pools for the tiny config of `server_args`, and the prefix cache of --disable-radix-cache."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

    model_config = ModelConfig(server_args.model_path)
    req_to_token_pool = ReqToTokenPool(size=max_reqs, max_context_len=1024, device="cpu", enable_memory_saver=False)
    kv_pool = MHATokenToKVPool(
        size=max_tokens, page_size=1, dtype=torch.float32, head_num=2, head_dim=HIDDEN // 4,
        layer_num=NUM_LAYERS, device="cpu", enable_memory_saver=False, enable_alt_stream=False,
    )  # fmt: skip
    allocator = TokenToKVPoolAllocator(
        size=max_tokens, dtype=torch.float32, device="cpu", kvcache=kv_pool, need_sort=False
    )
    params = CacheInitParams(
        disable=True, req_to_token_pool=req_to_token_pool, token_to_kv_pool_allocator=allocator, page_size=1,
        is_eagle=True,
    )  # fmt: skip
    tree_cache = _prefix_cache(server_args, model_config, params, max_tokens)
    return Pools(model_config, req_to_token_pool, kv_pool, allocator, tree_cache, _future_map(req_to_token_pool))


def _prefix_cache(server_args: ServerArgs, model_config: Any, params: Any, max_tokens: int) -> Any:
    """What the scheduler builds: create_tree_cache where the release has that registry (0.5.15: a
    ChunkCache, 0.5.23: a disabled UnifiedRadixCache), else 0.5.9's ChunkCache."""
    registry = sglang_module("sglang.srt.mem_cache.registry")
    if registry is None or not hasattr(registry, "create_tree_cache"):
        from sglang.srt.mem_cache.chunk_cache import ChunkCache

        return ChunkCache(params)
    context = {
        "server_args": server_args, "params": params, "is_hybrid_swa": False, "is_hybrid_ssm": False,
        "enable_hierarchical_cache": False, "disable_radix_cache": True, "tp_worker": None,
        "model_config": model_config, "tp_size": 1, "tp_rank": 0, "tp_group": None,
        # 0.5.15 picks the ChunkCache only under chunked prefill, whose size __post_init__ would
        # resolve: unresolved, a chunk as large as the pool.
        "effective_chunked_prefill_size": server_args.chunked_prefill_size or max_tokens,
    }  # fmt: skip
    fields = {f.name for f in dataclasses.fields(registry.TreeCacheBuildContext)}
    ctx = registry.TreeCacheBuildContext(**{k: v for k, v in context.items() if k in fields})
    return registry.create_tree_cache(ctx)


def _future_map(req_to_token_pool: Any) -> Any:
    """The pool-indexed FutureMap the overlap scheduler relays spec v2 through (publish/stash,
    0.5.1x on); 0.5.9's is a ring the tests that need it build themselves."""
    from sglang.srt.managers.overlap_utils import FutureMap
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    if not hasattr(FutureMap, "publish"):
        return None
    # needs_cpu_seq_lens: torch_native declares no opt-out, so the scheduler keeps the CPU mirror.
    return FutureMap(torch.device("cpu"), SpeculativeAlgorithm.EAGLE3, req_to_token_pool, needs_cpu_seq_lens=True)


def make_req(
    rid: str, prompt_len: int, *, max_new_tokens: int = 64, stop_token_ids: Optional[List[int]] = None,
    sampling: Optional[dict] = None, return_logprob: bool = False, top_logprobs_num: int = 0, tokenizer: Any = None,
) -> Req:  # fmt: skip
    """A Req as the scheduler builds it from a TokenizedGenerateReqInput. With a tokenizer (stop
    strings and min_new_tokens need one: verify_cpu.word_tokenizer), the scheduler's: the request holds it."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=stop_token_ids, **(sampling or {}))
    params.normalize(tokenizer)
    params.verify(VOCAB)
    ids = [(7 * i + len(rid)) % (VOCAB - 10) + 10 for i in range(prompt_len)]
    # The prompt as the release's Req declares it: array('q') from 0.5.1x on, a list on 0.5.9.
    declared = inspect.signature(Req.__init__).parameters["origin_input_ids"].annotation
    input_ids = array("q", ids) if "array" in str(declared) else ids
    logprobs = {"return_logprob": return_logprob, "top_logprobs_num": top_logprobs_num}
    req = Req(rid, "", input_ids, params, vocab_size=VOCAB, eos_token_ids={2}, **logprobs)
    req.tokenizer = tokenizer
    return req


def prefill_batch(pools: Pools, reqs: Sequence[Req], *, overlap: bool = True) -> ScheduleBatch:
    """A prefill batch of whole prompts as get_new_batch_prefill builds it: PrefillAdder's admission
    (the prefix match, then the release's record of the range to extend: set_extend_range on 0.5.15;
    extend_end and the lock on the matched node on 0.5.23; 0.5.9 reads the fill ids), then
    prepare_for_extend (KV slots, lengths; from 0.5.1x on also the sampling info)."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    for req in reqs:
        req.init_next_round_input(pools.tree_cache)
        if hasattr(req, "set_extend_range"):
            req.set_extend_range(len(req.prefix_indices), len(req.full_untruncated_fill_ids))
        elif hasattr(req, "extend_end"):  # _commit_prefill_admission
            req.extend_end = len(req.full_untruncated_fill_ids)
            req.lock = pools.tree_cache.lock(req.last_node)
    batch = ScheduleBatch.init_new(
        list(reqs), pools.req_to_token_pool, pools.allocator, pools.tree_cache, pools.model_config,
        enable_overlap=overlap, spec_algorithm=SpeculativeAlgorithm.EAGLE3,
    )  # fmt: skip
    batch.prepare_for_extend()
    prompt_lens = [len(r.origin_input_ids) for r in reqs]
    if batch.seq_lens.tolist() != prompt_lens:
        raise AssertionError(f"the prefill left seq_lens {batch.seq_lens.tolist()} for prompts of {prompt_lens}")
    return batch


def prefilled_decode_batch(
    pools: Pools, reqs: Sequence[Req], first_tokens: Sequence[int], *, overlap: bool = False, topk: int = 4,
    carry_emitted: bool = False, decode: bool = True,
) -> ScheduleBatch:  # fmt: skip
    """A speculative decode batch as 0.5.9's scheduler holds it after prefill + draft extend.

    The prefill is SGLang's own (prefill_batch); its sampled token is appended by the output
    processor and is the pending `verified_id` of the draft input (0.5.9's EagleDraftInput).
    carry_emitted: the v2 worker leaves the sampled tokens for the penalty counts (0013), from the
    overlap scheduler's forward copy of the sampling info. decode=False: the batch as it is merged
    into the running batch, before any decode preparation.
    """
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    batch = prefill_batch(pools, reqs, overlap=overlap)
    for req, token in zip(reqs, first_tokens, strict=True):
        req.output_ids.append(token)
    batch.sampling_info = SamplingBatchInfo.from_schedule_batch(batch, VOCAB)
    batch.spec_info = EagleDraftInput(
        hidden_states=torch.randn(len(reqs), HIDDEN),
        verified_id=torch.tensor(first_tokens, dtype=torch.int32),
        topk_p=torch.full((len(reqs), topk), 1.0 / topk),
        topk_index=torch.arange(topk).repeat(len(reqs), 1) + 10,
        # Spec v2 carries the lengths through the FutureMap.
        new_seq_lens=batch.seq_lens.clone() if overlap else None,
    )
    if carry_emitted:
        from sglang.srt.speculative.spec_penalties_v2 import carry_emitted_tokens

        first = torch.tensor(first_tokens, dtype=torch.int64).unsqueeze(1)
        carry_emitted_tokens(batch.spec_info, first, batch.sampling_info.copy_for_forward())
    if decode:
        batch.prepare_for_decode()
    return batch


def model_runner_for_forward_batch(pools: Pools, server_args: ServerArgs) -> ModelRunner:
    """A ModelRunner without __init__ (no model, no GPU), holding what ForwardBatch.init_new reads:
    device, server_args and model_config; is_draft_worker; the pools and allocator; LoRA (off); and
    what __init__ derives from the config, as the release does it: 0.5.15's use_ngram_embedding and
    model_is_mrope flags; 0.5.23's n-gram embedding manager, the KV index translator over the pools
    (0.5.23 binds a KV location plan to every forward batch) and the attention backends' names;
    0.5.9's runner needs none of these (no n-gram embedding, model_is_mrope a property). Set
    attn_backend where the forward batch is built for a runner's forward (init_new copies it).
    init_new also reads get_parallel(): call init_single_rank_groups() first.
    """
    from sglang.srt.model_executor.model_runner import ModelRunner

    runner = object.__new__(ModelRunner)
    runner.device, runner.server_args, runner.model_config = server_args.device, server_args, pools.model_config
    runner.is_draft_worker, runner.lora_manager = False, None
    runner.token_to_kv_pool, runner.req_to_token_pool = pools.kv_pool, pools.req_to_token_pool
    runner.token_to_kv_pool_allocator, runner.page_size = pools.allocator, 1
    # Every release's __init__ copies it from the config; 0.5.10's init_new reads it.
    runner.is_hybrid_swa = pools.model_config.is_hybrid_swa
    if hasattr(ModelRunner, "init_ngram_embedding_manager"):
        # Its model's n-gram layers: the tiny llama has none (the manager reads no further).
        runner.model, runner.max_running_requests = torch.nn.Module(), pools.req_to_token_pool.size
        runner.init_ngram_embedding_manager()
    elif hasattr(pools.model_config, "use_ngram_embedding"):  # 0.5.15 (0.5.9 has no n-gram embedding)
        runner.use_ngram_embedding = pools.model_config.use_ngram_embedding
    # 0.5.15 keeps the flag on the runner; 0.5.9's runner derives it (a property) from the config.
    if not hasattr(pools.model_config, "model_is_mrope") and not isinstance(
        ModelRunner.__dict__.get("model_is_mrope"), property
    ):
        hf = pools.model_config.hf_text_config
        rope_scaling = getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", {})
        runner.model_is_mrope = rope_scaling is not None and "mrope_section" in rope_scaling
    if hasattr(ModelRunner, "init_kv_index_translator"):
        runner.init_kv_index_translator()
    setup = sglang_module("sglang.srt.model_executor.model_runner_components.attention_backend_setup")
    if setup is not None and hasattr(setup, "resolve_attention_backend_strs"):  # 0.5.23: extend positions follow it
        runner.draft_attention_backend = None  # a target runner's (resolve_draft_attention_backend)
        resolved = setup.resolve_attention_backend_strs(model_runner=runner)
        runner.prefill_attention_backend_str, runner.decode_attention_backend_str = resolved.prefill, resolved.decode
    return runner


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


# ---- the triton kernels on these paths, as torch references -------------------------------------

# Each kernel, and the modules that look it up at launch in one release or another (a module's own
# kernel, or its import of another's): swapped wherever the imported release has it.
_KERNEL_SITES = {
    "assign_req_to_token_pool": ("srt.speculative.spec_utils", "srt.speculative.triton_ops.cache_locs",
                                 "srt.mem_cache.allocation"),
    "assign_extend_cache_locs": ("srt.speculative.eagle_info_v2", "srt.speculative.eagle_worker_v2",
                                 "srt.speculative.spec_utils", "srt.speculative.triton_ops.cache_locs",
                                 "kernels.ops.speculative.cache_locs"),
    "assign_extend_cache_locs_uniform": ("kernels.ops.speculative.cache_locs",),
    "assign_draft_cache_locs": ("srt.speculative.eagle_worker", "srt.speculative.spec_utils"),
    "assign_draft_cache_locs_contiguous": ("srt.speculative.triton_ops.cache_locs", "kernels.ops.speculative.cache_locs"),
    "create_extend_after_decode_spec_info": ("srt.speculative.eagle_info", "srt.speculative.spec_utils"),
    "fill_bonus_tokens": ("srt.speculative.eagle_worker_v2", "kernels.ops.speculative.eagle"),
    "fill_accept_out_cache_loc": ("srt.speculative.spec_utils", "kernels.ops.speculative.eagle"),
}  # fmt: skip


def use_torch_kernels(monkeypatch: Any) -> None:
    """Swap the triton kernels for their torch references (kernel_refs), where looked up at launch.

    The wrappers that launch them (`*_func`) are SGLang's own and run: where a wrapper module
    defines assign_extend_cache_locs_func, which has no CPU branch but native CPU-engine ops, its
    CUDA branch is taken (it allocates the int64 result and launches the kernel replaced here).
    FutureMap's spec-extras gather (gather_spec_extras) runs as its reference too, and the stream
    it records its indices on (0.5.15) is a CUDA caching-allocator hint, a no-op for CPU tensors.
    """
    for name, sites in _KERNEL_SITES.items():
        for site in sites:
            module = sglang_module(f"sglang.{site}")
            if module is None:
                continue
            if hasattr(module, name):
                monkeypatch.setattr(module, name, Launcher(getattr(kernel_refs, name)))
            wrapper = getattr(module, "assign_extend_cache_locs_func", None)
            if wrapper is not None and wrapper.__module__ == module.__name__:
                monkeypatch.setattr(module, "_is_cuda", True)
    overlap_utils = sglang_module("sglang.srt.managers.overlap_utils")
    if hasattr(overlap_utils, "gather_spec_extras"):
        monkeypatch.setattr(overlap_utils, "gather_spec_extras", kernel_refs.gather_spec_extras)
    record_stream = torch.Tensor.record_stream

    def record_stream_on_a_gpu(tensor: torch.Tensor, stream: Any) -> None:
        if tensor.device.type != "cpu":
            record_stream(tensor, stream)

    monkeypatch.setattr(torch.Tensor, "record_stream", record_stream_on_a_gpu)
