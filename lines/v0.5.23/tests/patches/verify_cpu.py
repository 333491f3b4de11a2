"""The EAGLE v2 worker's decode step on CPU: its own forward_batch_generation and verify
(run_eagle_verify, eagle_prepare_for_verify, eagle_sample), with the two models stood in for.

The target's forward returns logits the test chose (its sampling preprocessing, where a step samples
with the regular sampler, is SGLang's own `ModelRunner._preprocess_logits`); the draft proposes the
chain the test chose and its extend fills the next draft input as the real one does. The native and
triton kernels on the path run as torch references: verify_tree_greedy (sgl_kernel), and the
fill_bonus_tokens, assign_extend_cache_locs_uniform and (for trees) fill_front_out_cache_loc and
fill_accept_out_cache_loc triton kernels. The tokenizer is a real
transformers fast tokenizer loaded through SGLang's get_tokenizer: token i is the word `w<i>`.
"""

from __future__ import annotations

import contextlib
import types
from pathlib import Path
from typing import List, Optional

import kernel_refs
import torch

from sglang_cpu import HIDDEN, TOPK, VOCAB


def word_tokenizer(path: Path):
    return kernel_refs.word_tokenizer(path, VOCAB)


# ---- torch references for the kernels on the verify path ------------------------------------


def verify_tree_greedy(
    predicts, accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token,
    retrieve_next_sibling, target_predict, topk=-1,
):  # fmt: skip
    """eagle_utils.verify_tree_greedy_func, with the argument names SGLang 0.5.23 passes."""
    kernel_refs.greedy_tree_walk(
        predicts, accept_index, accept_token_num, candidates, retrieve_index, retrieve_next_token,
        retrieve_next_sibling, target_predict,
    )  # fmt: skip
    return predicts, accept_index, accept_token_num


def fill_bonus_tokens(accept_tokens, accept_lens, bonus_tokens, accept_stride, batch_size):
    # Program b stores accept_tokens[b * stride + accept_len - 1] (the bonus, the last accepted).
    flat = accept_tokens.reshape(-1)
    for b in range(batch_size):
        bonus_tokens[b] = flat[accept_stride * b + int(accept_lens[b]) - 1]


def assign_extend_cache_locs_uniform(
    req_pool_indices, req_to_token, start_offset, batch_size, draft_token_num, device, **_
):
    # Program b reads req_to_token[pool_idx_b, start_b : start_b + draft_token_num].
    rows = [
        req_to_token[req_pool_indices[b], start_offset[b] : start_offset[b] + draft_token_num]
        for b in range(batch_size)
    ]
    return torch.cat(rows).to(torch.int64)  # fmt: skip


def fill_front_out_cache_loc(num_front, out_cache_loc, front_out_cache_loc):
    # Packs the first num_front[i] slots of request i's verify window, request after request.
    window = out_cache_loc.view(num_front.numel(), -1)
    front = torch.cat([window[i, : int(n)] for i, n in enumerate(num_front)])
    front_out_cache_loc[: front.numel()] = front


def fill_accept_out_cache_loc(accept_index, out_cache_loc, accept_out_cache_loc, size):
    # Program j stores out_cache_loc[accept_index[j]] at the count of accepted entries before j.
    accepted = accept_index.reshape(-1)[:size]
    accepted = accepted[accepted > -1].long()
    accept_out_cache_loc[: accepted.numel()] = out_cache_loc[accepted]


def use_torch_verify(monkeypatch) -> None:
    """Swap the verify path's kernels for the references above, where SGLang looks them up."""
    import sglang.kernels.ops.speculative.cache_locs as cache_locs
    import sglang.srt.speculative.eagle_utils as eagle_utils
    import sglang.srt.speculative.eagle_worker_common as common
    import sglang.srt.speculative.spec_utils as spec_utils

    monkeypatch.setattr(eagle_utils, "verify_tree_greedy_func", verify_tree_greedy)
    # A tree's accepted path is moved to the front of its window (topk > 1).
    monkeypatch.setattr(spec_utils, "fill_front_out_cache_loc_func", fill_front_out_cache_loc)
    monkeypatch.setattr(spec_utils, "fill_accept_out_cache_loc_func", fill_accept_out_cache_loc)
    monkeypatch.setattr(common, "fill_bonus_tokens_func", fill_bonus_tokens)
    monkeypatch.setattr(cache_locs, "assign_extend_cache_locs_uniform_func", assign_extend_cache_locs_uniform)
    # eagle_prepare_for_verify resolves its kernels once, lazily.
    monkeypatch.setattr(eagle_utils, "_PREPARE_FOR_VERIFY_DEPS", None)


def tree_verify_input(draft_tokens: torch.Tensor, seq_lens: torch.Tensor, parent: List[int]):
    """The EagleVerifyInput a draft builds for the tree `parent` (node -> parent, -1 for the
    root, parents before children), the same for every request: retrieve_next_token is a node's
    first child, retrieve_next_sibling its next sibling, positions its depth after seq_lens.

    Column 0 of draft_tokens [bs, D] is the root (the pending token); logits row b * D + j predict
    the token after draft node j.
    """
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    bs, num_draft = draft_tokens.shape
    next_token, next_sibling, depth = [-1] * num_draft, [-1] * num_draft, [0] * num_draft
    for node in range(num_draft - 1, 0, -1):  # youngest first: each child ends up first
        next_sibling[node], next_token[parent[node]] = next_token[parent[node]], node
    for node in range(1, num_draft):
        depth[node] = depth[parent[node]] + 1
    children = [parent.count(node) for node in range(num_draft)]
    return EagleVerifyInput(
        draft_token=draft_tokens.reshape(-1).clone(), custom_mask=None,
        positions=(seq_lens.unsqueeze(1) + torch.tensor(depth)).reshape(-1),
        retrieve_index=torch.arange(bs).unsqueeze(1) * num_draft + torch.arange(num_draft),
        retrieve_next_token=torch.tensor(next_token).repeat(bs, 1),
        retrieve_next_sibling=torch.tensor(next_sibling).repeat(bs, 1), retrieve_cum_len=None,
        spec_steps=max(depth), topk=max(children), draft_token_num=num_draft,
        capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=None, seq_lens_cpu=None,
    )  # fmt: skip


def chain_parent(num_draft: int) -> List[int]:
    """A topk-1 draft's tree: root -> d1 -> ... -> dk."""
    return list(range(-1, num_draft - 1))


# ---- the two models, stood in for -----------------------------------------------------------


class StandInTarget:
    """The target worker: ForwardBatch-free outputs of the shapes the real one returns.

    A prefill samples `next_token_ids`; a verify returns `logits` ([bs * D, V], kept so the test can
    read what eagle_sample did to them in place); a plain DECODE (0002's steps=0 route) runs the
    regular sampler's preprocessing (SGLang's own) on `logits` and takes the argmax, as a greedy
    request samples.
    """

    def __init__(self, pools, server_args):
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        from sglang_cpu import model_runner_for_forward_batch

        self.model_runner = model_runner_for_forward_batch(pools, server_args)
        self.model_runner.spec_algorithm = SpeculativeAlgorithm.EAGLE3
        self.model_runner.decode_cuda_graph_runner = None  # eager verify
        self.model_runner.watermark_state = None
        self.model_runner.shared_read_done_event = None
        self.model_runner.attn_backend = types.SimpleNamespace(verify_mask=None)
        self.next_token_ids: Optional[List[int]] = None
        self.logits: Optional[torch.Tensor] = None
        self.modes: List[str] = []  # the forward each step ran

    def _result(self, logits, next_token_ids=None):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult

        # EAGLE-3 captures three target layers.
        hidden = torch.ones(logits.shape[0], 3 * HIDDEN)
        output = LogitsProcessorOutput(next_token_logits=logits, hidden_states=hidden)
        return GenerationBatchResult(logits_output=output, next_token_ids=next_token_ids, can_run_cuda_graph=False)

    def forward_batch_generation(
        self, batch=None, forward_batch=None, *, is_verify=False, capture_hidden_mode=None, **_
    ):
        from sglang.srt.model_executor.model_runner import ModelRunner

        if is_verify:
            self.modes.append(forward_batch.forward_mode.name)
            return self._result(self.logits)
        self.modes.append(batch.forward_mode.name)
        if batch.forward_mode.is_decode():
            logits = self.logits.clone()
            output = self._result(logits).logits_output
            ModelRunner._preprocess_logits(self.model_runner, output, batch.sampling_info)
            self.logits = logits
            return self._result(logits, torch.argmax(logits, dim=-1))
        return self._result(torch.zeros(len(batch.reqs), VOCAB), torch.tensor(self.next_token_ids))


class StandInDraft:
    """The draft worker: it proposes `draft_tokens` after each request's pending token, and its
    extends fill the next draft input (top-k, hidden) in place, as EagleDraftWorker's do."""

    def __init__(self):
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.parallel_layout = types.SimpleNamespace(tp_group=None)  # draft TP is the target's
        self.draft_runner = types.SimpleNamespace(
            spec_algorithm=SpeculativeAlgorithm.EAGLE3, shared_read_done_event=None,
            model_config=types.SimpleNamespace(spec_hidden_size=HIDDEN, dtype=torch.float32))  # fmt: skip
        self.draft_tokens: Optional[List[List[int]]] = None
        self.tree: Optional[List[int]] = None  # parents, a chain by default

    @staticmethod
    def _fill(draft_input, bs):
        draft_input.topk_p = torch.full((bs, TOPK), 1.0 / TOPK)
        draft_input.topk_index = torch.arange(TOPK).repeat(bs, 1) + 10
        draft_input.hidden_states = torch.randn(bs, HIDDEN)

    def draft(self, batch):
        pending = batch.spec_info.bonus_tokens.long().unsqueeze(1)
        nodes = torch.cat([pending, torch.tensor(self.draft_tokens)], dim=1)
        return tree_verify_input(nodes, batch.seq_lens, self.tree or chain_parent(nodes.shape[1]))

    def _draft_extend_for_prefill(self, batch, hidden_states, next_token_ids, mm_input_embeds=None, kv_loc_plan=None):
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        bs = len(batch.reqs)
        draft_input = EagleDraftInput(
            bonus_tokens=next_token_ids.to(torch.int32), num_tokens_per_req=1, num_tokens_for_logprob_per_req=1
        )
        self._fill(draft_input, bs)
        return draft_input

    def _draft_extend_for_decode(self, batch, batch_result, kv_loc_plan=None):
        self._fill(batch_result.next_draft_input, len(batch.reqs))


def eagle_worker(pools, server_args, *, num_steps: int = 3, num_draft_tokens: int = 4):
    """An EAGLEWorkerV2 (object.__new__: no models) with the stand-ins, no adaptive controller."""
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    worker = object.__new__(EAGLEWorkerV2)
    worker.adaptive_controller, worker.enable_dp_spec_prefill_coordination = None, False
    worker.topk, worker.device, worker.page_size = TOPK, "cpu", 1
    worker.speculative_num_steps, worker.speculative_num_draft_tokens = num_steps, num_draft_tokens
    worker.speculative_algorithm = SpeculativeAlgorithm.EAGLE3
    worker.plan_stream, worker.plan_stream_ctx = None, contextlib.nullcontext()
    worker.req_to_token_pool, worker.token_to_kv_pool_allocator = pools.req_to_token_pool, pools.allocator
    worker._target_worker, worker._draft_worker = StandInTarget(pools, server_args), StandInDraft()
    return worker


def spec_env(tmp_path: Path, monkeypatch, *, num_draft_tokens: int = 4):
    """A CPU EAGLE-3 server's scheduler side (sglang_cpu) around an eagle_worker, with the
    kernels on the decode and verify paths as torch references."""
    from sglang_cpu import (
        OverlapLoop,
        init_single_rank_groups,
        make_pools,
        make_server_args,
        use_torch_kernels,
        write_tiny_llama_config,
    )

    server_args = make_server_args(write_tiny_llama_config(tmp_path / "model"))
    use_torch_kernels(monkeypatch)
    use_torch_verify(monkeypatch)
    init_single_rank_groups()
    pools = make_pools(server_args)
    worker = eagle_worker(pools, server_args, num_draft_tokens=num_draft_tokens)
    return types.SimpleNamespace(
        pools=pools, worker=worker, target=worker._target_worker, draft=worker._draft_worker,
        loop=OverlapLoop(pools, worker), tokenizer=word_tokenizer(tmp_path / "tokenizer"),
    )  # fmt: skip
