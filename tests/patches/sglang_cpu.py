"""Real SGLang scheduler objects on CPU, and torch references for the triton kernels they launch.

Everything here is SGLang's own code (pools, allocator, Req, ScheduleBatch, SamplingBatchInfo,
EagleDraftInput), except the triton kernels, which cannot launch without a GPU: `use_torch_kernels`
swaps each one, where SGLang's modules imported it, for a torch loop computing the same thing.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import List, Optional, Sequence

import torch

HIDDEN = 64
VOCAB = 512
NUM_LAYERS = 8


def write_tiny_llama_config(path: Path) -> Path:
    """A local HF config, so ModelConfig is the real class without any download."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": HIDDEN,
                "intermediate_size": 4 * HIDDEN,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "num_hidden_layers": NUM_LAYERS,
                "vocab_size": VOCAB,
                "max_position_embeddings": 4096,
                "rms_norm_eps": 1e-5,
                "torch_dtype": "float32",
                "eos_token_id": 2,
                "bos_token_id": 1,
            }
        )
    )
    return path


def server_args_with_defaults(**overrides):
    """A ServerArgs holding its field defaults, without __post_init__'s GPU probing."""
    from sglang.srt.server_args import ServerArgs

    args = object.__new__(ServerArgs)
    for field in dataclasses.fields(ServerArgs):
        if field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            value = None
        setattr(args, field.name, value)
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def make_server_args(model_path: Path, **overrides):
    """The global ServerArgs the scheduler objects read, set up for a CPU EAGLE-3 batch."""
    from sglang.srt.server_args import set_global_server_args_for_scheduler

    args = server_args_with_defaults()
    args.model_path = str(model_path)
    args.device = "cpu"
    args.page_size = 1
    # SGLang's own non-triton path for writing req_to_token (triton cannot launch on CPU).
    args.attention_backend = "torch_native"
    args.speculative_algorithm = "EAGLE3"
    args.speculative_num_steps = 3
    args.speculative_eagle_topk = 4
    args.speculative_num_draft_tokens = 16
    for key, value in overrides.items():
        setattr(args, key, value)
    set_global_server_args_for_scheduler(args)
    return args


@dataclasses.dataclass
class Pools:
    model_config: object
    req_to_token_pool: object
    kv_pool: object
    allocator: object
    tree_cache: object


def make_pools(model_path: Path, max_reqs: int = 64, max_tokens: int = 8192) -> Pools:
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.chunk_cache import ChunkCache
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

    model_config = ModelConfig(str(model_path))
    req_to_token_pool = ReqToTokenPool(size=max_reqs, max_context_len=1024, device="cpu", enable_memory_saver=False)
    kv_pool = MHATokenToKVPool(
        size=max_tokens,
        page_size=1,
        dtype=torch.float32,
        head_num=2,
        head_dim=HIDDEN // 4,
        layer_num=NUM_LAYERS,
        device="cpu",
        enable_memory_saver=False,
        enable_alt_stream=False,
    )
    allocator = TokenToKVPoolAllocator(
        size=max_tokens, dtype=torch.float32, device="cpu", kvcache=kv_pool, need_sort=False
    )
    tree_cache = ChunkCache(
        CacheInitParams(
            disable=True,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=allocator,
            page_size=1,
            is_eagle=True,
        )
    )
    return Pools(model_config, req_to_token_pool, kv_pool, allocator, tree_cache)


def make_req(
    rid: str,
    prompt_len: int,
    *,
    max_new_tokens: int = 64,
    stop_token_ids: Optional[List[int]] = None,
    sampling: Optional[dict] = None,
    return_logprob: bool = False,
    top_logprobs_num: int = 0,
):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=stop_token_ids, **(sampling or {}))
    params.normalize(None)
    params.verify(VOCAB)
    input_ids = [(7 * i + len(rid)) % (VOCAB - 10) + 10 for i in range(prompt_len)]
    return Req(
        rid,
        "",
        input_ids,
        params,
        return_logprob=return_logprob,
        top_logprobs_num=top_logprobs_num,
        vocab_size=VOCAB,
        eos_token_ids={2},
    )


def prefilled_decode_batch(
    pools: Pools,
    reqs: Sequence,
    first_tokens: Sequence[int],
    *,
    overlap: bool = False,
    topk: int = 4,
    carry_emitted: bool = False,
    decode: bool = True,
):
    """A speculative decode batch as the scheduler holds it after prefill + draft extend.

    The prefill is SGLang's own: `Req.init_next_round_input` (fill ids, prefix match) as the
    scheduler's prefill adder calls it, then `prepare_for_extend` (KV slots, lengths); its sampled
    token is appended by the output processor and is the pending `verified_id` of the draft input.
    carry_emitted: the v2 worker leaves the sampled tokens for the penalty counts (0013), from the
    overlap scheduler's forward copy of the sampling info. decode=False: the batch as it is merged
    into the running batch, before any decode preparation.
    """
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    for req in reqs:
        req.init_next_round_input(pools.tree_cache)
    batch = ScheduleBatch.init_new(
        list(reqs),
        pools.req_to_token_pool,
        pools.allocator,
        pools.tree_cache,
        pools.model_config,
        enable_overlap=overlap,
        spec_algorithm=SpeculativeAlgorithm.EAGLE3,
    )
    batch.prepare_for_extend()
    prompt_lens = [len(r.origin_input_ids) for r in reqs]
    if batch.seq_lens.tolist() != prompt_lens:
        raise AssertionError(f"the prefill left seq_lens {batch.seq_lens.tolist()} for prompts of {prompt_lens}")
    for req, token in zip(reqs, first_tokens, strict=False):
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


# ---- torch references for the triton kernels on these paths --------------------------------


def _create_extend_after_decode_spec_info(verified_id, seq_lens, accept_lens, positions, new_verified_id, _pow2):
    # Per request: the accepted tokens sit at positions seq_len - accept_len ... seq_len - 1;
    # the last one becomes the next verified id.
    start = 0
    for i in range(seq_lens.numel()):
        n = int(accept_lens[i])
        seq_len = int(seq_lens[i])
        positions[start : start + n] = torch.arange(seq_len - n, seq_len)
        new_verified_id[i] = verified_id[start + n - 1]
        start += n


class Launcher:
    """`kernel[grid](*args)` calls `fn(*args)`, like a triton JIT function."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return self.fn


def _assign_draft_cache_locs(
    req_pool_indices,
    req_to_token,
    seq_lens,
    extend_lens,
    num_new_pages_per_topk,
    out_cache_loc,
    source_cache_loc,
    target_cache_loc,
    last_page_lens_cumsum,
    duplicate_cache_len,
    pool_len,
    topk,
    speculative_num_steps,
    page_size,
    *_pow2,
):
    # page_size 1: request i owns out_cache_loc[i*topk*steps : (i+1)*topk*steps], written to
    # req_to_token after its sequence, topk-major.
    assert page_size == 1
    per_req = topk * speculative_num_steps
    for i in range(seq_lens.numel()):
        locs = out_cache_loc[i * per_req : (i + 1) * per_req]
        s = int(seq_lens[i])
        req_to_token[req_pool_indices[i], s : s + per_req] = locs.to(req_to_token.dtype)


def _assign_req_to_token_pool(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, *_constexprs):
    # Request i's slots [start_i, end_i) of req_to_token take the next end_i - start_i
    # entries of out_cache_loc.
    pt = 0
    for i in range(req_pool_indices.numel()):
        start, end = int(start_offset[i]), int(end_offset[i])
        req_to_token[req_pool_indices[i], start:end] = out_cache_loc[pt : pt + end - start].to(req_to_token.dtype)
        pt += end - start


def _assign_extend_cache_locs(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, *_constexprs):
    # The reverse gather: out_cache_loc takes request i's slots [start_i, end_i), concatenated.
    pt = 0
    for i in range(req_pool_indices.numel()):
        start, end = int(start_offset[i]), int(end_offset[i])
        out_cache_loc[pt : pt + end - start] = req_to_token[req_pool_indices[i], start:end]
        pt += end - start


def use_torch_kernels(monkeypatch) -> None:
    import sglang.srt.speculative.eagle_info as eagle_info
    import sglang.srt.speculative.eagle_info_v2 as eagle_info_v2
    import sglang.srt.speculative.eagle_worker as eagle_worker
    import sglang.srt.speculative.spec_utils as spec_utils

    monkeypatch.setattr(spec_utils, "assign_req_to_token_pool", Launcher(_assign_req_to_token_pool))
    monkeypatch.setattr(eagle_info_v2, "assign_extend_cache_locs", Launcher(_assign_extend_cache_locs))
    # Take SGLang's CUDA branch of assign_extend_cache_locs_func, whose kernel is replaced above.
    monkeypatch.setattr(eagle_info_v2, "_is_cuda", True)

    monkeypatch.setattr(
        eagle_info,
        "create_extend_after_decode_spec_info",
        Launcher(_create_extend_after_decode_spec_info),
    )
    monkeypatch.setattr(eagle_worker, "assign_draft_cache_locs", Launcher(_assign_draft_cache_locs))


def init_single_rank_groups() -> None:
    """SGLang's own process groups for one rank (gloo), as a TP1 server sets them up."""
    import socket

    from sglang.srt.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    parallel_state.init_distributed_environment(
        world_size=1,
        rank=0,
        local_rank=0,
        distributed_init_method=f"tcp://127.0.0.1:{port}",
        backend="gloo",
    )
    parallel_state.initialize_model_parallel(backend="gloo")
