"""Torch references for the GPU kernels on the CPU tests' paths, and a word-level tokenizer.

A triton kernel cannot launch without a GPU and sgl-kernel's native ops need its CUDA library, so
sglang_cpu.use_torch_kernels and verify_cpu.use_torch_verify put these in their place wherever the
imported release looks the kernel up. Each computes what its kernel computes, for the arguments
SGLang passes it; a kernel keeps its name and argument order across the releases that have it.
Nothing here imports SGLang but the tokenizer (which loads through SGLang's own get_tokenizer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch


class Launcher:
    """`kernel[grid](*args)` calls `fn(*args)`, like a triton JIT function."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return self.fn


def word_tokenizer(path: Path, vocab_size: int):
    """A real transformers fast tokenizer through SGLang's get_tokenizer: token i is the word `w<i>`,
    EOS is `w2` (id 2), so a test writes stop strings as words and knows their token ids."""
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size)}
    model = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    model.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=model, eos_token="w2").save_pretrained(path)
    return get_tokenizer(str(path))


# ---- the native greedy verify (sgl_kernel's op schema, which every release's wrapper calls) ----


def verify_tree_greedy(
    predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
    retrive_next_sibling, target_predict,
) -> None:  # fmt: skip
    # From the root, follow the child (then its siblings) whose draft token equals the target's
    # prediction at the last accepted node; write the target's prediction at every accepted node
    # and the bonus at the last one.
    flat_target = target_predict.reshape(-1)
    bs, steps = candidates.shape[0], accept_index.shape[1]
    for b in range(bs):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, steps):
            cur = int(retrive_next_token[b, cur])
            while cur != -1:
                if int(candidates[b, cur]) == int(flat_target[last]):
                    predicts[last] = flat_target[last]
                    accepted += 1
                    accept_index[b, accepted] = retrive_index[b, cur]
                    last = int(retrive_index[b, cur])
                    break
                cur = int(retrive_next_sibling[b, cur])
            if cur == -1:
                break
        accept_token_num[b] = accepted
        predicts[last] = flat_target[last]


# ---- triton kernels: KV cache locations ---------------------------------------------------------


def assign_req_to_token_pool(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, *_constexprs):
    # Program i writes req_to_token[pool_idx_i, start_i:end_i] from out_cache_loc, starting at
    # the sum of the earlier requests' (end - start).
    pt = 0
    for i in range(req_pool_indices.numel()):
        start, end = int(start_offset[i]), int(end_offset[i])
        req_to_token[req_pool_indices[i], start:end] = out_cache_loc[pt : pt + end - start].to(req_to_token.dtype)
        pt += end - start


def assign_extend_cache_locs(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, *_constexprs):
    # The reverse gather: out_cache_loc, at the same running offset, takes request i's slots
    # req_to_token[pool_idx_i, start_i:end_i].
    pt = 0
    for i in range(req_pool_indices.numel()):
        start, end = int(start_offset[i]), int(end_offset[i])
        out_cache_loc[pt : pt + end - start] = req_to_token[req_pool_indices[i], start:end]
        pt += end - start


def assign_extend_cache_locs_uniform(
    req_pool_indices, req_to_token, start_offset, out_cache_loc, _pool_len, draft_token_num, PAGE_SIZE=1, **fused
):
    # assign_extend_cache_locs with end = start + draft_token_num for every request. The fused
    # outputs (physical write windows, positions, anchors) are not asked for on these paths.
    asked = sorted(name for name, value in fused.items() if torch.is_tensor(value))
    if PAGE_SIZE != 1 or asked:
        raise NotImplementedError(f"no reference for page size {PAGE_SIZE} or the fused outputs {asked}")
    end_offset = start_offset + draft_token_num
    assign_extend_cache_locs(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc)


def assign_draft_cache_locs(
    req_pool_indices, req_to_token, seq_lens, extend_lens, num_new_pages_per_topk, out_cache_loc,
    source_cache_loc, target_cache_loc, last_page_lens_cumsum, duplicate_cache_len, pool_len, topk,
    speculative_num_steps, page_size, *_pow2,
):  # fmt: skip
    # page_size 1: request i owns out_cache_loc[i*topk*steps : (i+1)*topk*steps], written to
    # req_to_token after its sequence, topk-major.
    assert page_size == 1
    per_req = topk * speculative_num_steps
    for i in range(seq_lens.numel()):
        locs = out_cache_loc[i * per_req : (i + 1) * per_req]
        s = int(seq_lens[i])
        req_to_token[req_pool_indices[i], s : s + per_req] = locs.to(req_to_token.dtype)


def assign_draft_cache_locs_contiguous(req_pool_indices, req_to_token, seq_lens, out_cache_loc, _pool_len, topk, steps):
    # Program i copies topk*steps slots of req_to_token from position seq_len_i into
    # out_cache_loc[i*topk*steps:], the draft steps' write targets.
    n = topk * steps
    for i in range(req_pool_indices.numel()):
        s = int(seq_lens[i])
        out_cache_loc[i * n : (i + 1) * n] = req_to_token[req_pool_indices[i], s : s + n]


# ---- triton kernels: draft inputs and accepted tokens -------------------------------------------


def create_extend_after_decode_spec_info(verified_id, seq_lens, accept_lens, positions, new_verified_id, _pow2):
    # Per request: the accepted tokens sit at positions seq_len - accept_len ... seq_len - 1;
    # the last one becomes the next verified id.
    start = 0
    for i in range(seq_lens.numel()):
        n = int(accept_lens[i])
        seq_len = int(seq_lens[i])
        positions[start : start + n] = torch.arange(seq_len - n, seq_len)
        new_verified_id[i] = verified_id[start + n - 1]
        start += n


def gather_spec_extras(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf):
    # One fused launch gathering the same rows of each buffer (hidden states only when captured).
    hidden = None if hidden_states_buf is None else hidden_states_buf[indices]
    return topk_p_buf[indices], topk_index_buf[indices], output_tokens_buf[indices], hidden


def fill_bonus_tokens(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    # Program b stores accept_tokens[b * stride + accept_lens[b] - 1], the last accepted token.
    flat = accept_tokens.reshape(-1)
    for b in range(accept_lens.numel()):
        bonus_tokens[b] = flat[accept_stride * b + int(accept_lens[b]) - 1]


def fill_accept_out_cache_loc(accept_index, out_cache_loc, accept_out_cache_loc, _size_upper):
    # Program j (one per entry of accept_index) stores out_cache_loc[accept_index[j]] at the count
    # of accepted entries before j: the accepted path's slots, packed.
    accepted = accept_index.reshape(-1)
    accepted = accepted[accepted > -1].long()
    accept_out_cache_loc[: accepted.numel()] = out_cache_loc[accepted]
