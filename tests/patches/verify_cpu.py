"""EAGLE verify on CPU, for every line: sgl-kernel's greedy verify as its torch reference, the verify
input a draft builds for a chain or a tree, a word-level tokenizer, and the two models of a v2
worker, stood in for.

The tokenizer is a real transformers fast tokenizer loaded through SGLang's own get_tokenizer:
token i is the word `w<i>`, so a test writes stop strings as words and knows their token ids. The
stood-in target builds its ForwardBatch and preprocesses its logits as the real worker does; only
the logits are the test's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, List, Optional, Sequence

import kernel_refs
import torch

from sglang_cpu import HIDDEN, TOPK, VOCAB, Pools, model_runner_for_forward_batch, sglang_module


def word_tokenizer(path: Path):
    return kernel_refs.word_tokenizer(path, VOCAB)


def use_torch_verify(monkeypatch: Any) -> None:
    """The greedy verify's native op as its torch reference, under SGLang's own wrapper
    (verify_tree_greedy_func: eagle_utils' on 0.5.9 and 0.5.15, spec_tree's on 0.5.23). The wrapper
    imports the op at call time on CUDA only: its CUDA branch is taken, and the op replaced where
    that branch imports it from (sgl_kernel; 0.5.23's own kernels.ops.speculative.tree)."""
    import sgl_kernel
    import sglang.srt.speculative.eagle_utils as eagle_utils

    wrapper_module = sys.modules[eagle_utils.verify_tree_greedy_func.__module__]
    monkeypatch.setattr(wrapper_module, "_is_cuda", True)
    monkeypatch.setattr(sgl_kernel, "verify_tree_greedy", kernel_refs.verify_tree_greedy, raising=False)
    tree_ops = sglang_module("sglang.kernels.ops.speculative.tree")
    if tree_ops is not None:
        monkeypatch.setattr(tree_ops, "verify_tree_greedy", kernel_refs.verify_tree_greedy)


def chain_parent(num_draft: int) -> List[int]:
    """A topk-1 draft's tree: root -> d1 -> ... -> dk."""
    return list(range(-1, num_draft - 1))


def verify_input(draft_tokens: torch.Tensor, seq_lens: torch.Tensor, parent: Optional[Sequence[int]] = None):
    """The EagleVerifyInput a draft builds for the tree `parent` (node -> parent, -1 for the root,
    parents before children; a chain by default), the same for every request: retrieve_next_token is
    a node's first child, retrieve_next_sibling its next sibling, positions its depth after seq_lens.

    Column 0 of draft_tokens [bs, D] is the root (the pending token); logits row b * D + j predict
    the token after draft node j. 0.5.9 spells the retrieve fields `retrive_*`.
    """
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    bs, num_draft = draft_tokens.shape
    parent = list(parent) if parent is not None else chain_parent(num_draft)
    next_token, next_sibling, depth = [-1] * num_draft, [-1] * num_draft, [0] * num_draft
    for node in range(num_draft - 1, 0, -1):  # youngest first: each child ends up first
        next_sibling[node], next_token[parent[node]] = next_token[parent[node]], node
    for node in range(1, num_draft):
        depth[node] = depth[parent[node]] + 1
    fields = {f.name for f in dataclasses.fields(EagleVerifyInput)}
    retrieve = "retrieve" if "retrieve_index" in fields else "retrive"
    tree = {
        f"{retrieve}_index": torch.arange(bs).unsqueeze(1) * num_draft + torch.arange(num_draft),
        f"{retrieve}_next_token": torch.tensor(next_token).repeat(bs, 1),
        f"{retrieve}_next_sibling": torch.tensor(next_sibling).repeat(bs, 1),
        f"{retrieve}_cum_len": None,
    }
    return EagleVerifyInput(
        draft_token=draft_tokens.reshape(-1).clone(), custom_mask=None,
        positions=(seq_lens.unsqueeze(1) + torch.tensor(depth)).reshape(-1), **tree,
        spec_steps=max(depth), topk=max(parent.count(node) for node in range(num_draft)), draft_token_num=num_draft,
        capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=int(seq_lens.sum()), seq_lens_cpu=seq_lens.cpu(),
    )  # fmt: skip


def logits_favouring(rows: int, token: int, margin: float = 10.0, seed: int = 0) -> torch.Tensor:
    """Random logits in [0, 1) with `token` ahead of every other by `margin`."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.rand(rows, VOCAB, generator=generator)
    logits[:, token] += margin
    return logits


# ---- the two models of a v2 worker, stood in for ------------------------------------------------


class PlannedLogits:
    """The stood-in target model: noise of both signs (a scaling penalty treats them apart) with the
    planned token `margin` ahead at each row, more than any penalty here takes off it.

    `plan(forward_batch)` gives the planned token of every row the target returns (one a request for
    a prefill or a decode, one a draft position for a verify)."""

    def __init__(self, seed: int = 0, margin: float = 6.0):
        self.plan: Optional[Callable[[Any], Sequence[int]]] = None
        self.margin = margin
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, forward_batch: Any) -> torch.Tensor:
        assert self.plan is not None, "the test plans the target's tokens first"
        favoured = torch.as_tensor(self.plan(forward_batch))
        logits = torch.randn(len(favoured), VOCAB, generator=self.generator) * 0.5
        logits[torch.arange(len(favoured)), favoured] += self.margin
        return logits


class StandInTarget:
    """The target worker, stood in for: it builds the ForwardBatch as TpModelWorker does
    (ForwardBatch.init_new, SGLang's own) unless the worker hands it one (a verify), and returns the
    logits `model(forward_batch)`; where the real worker samples (prefill, plain decode), it runs
    ModelRunner's own logits preprocessing (the penalties) and takes the greedy pick. `seen` keeps
    each call's forward batch, raw logits and the logits it returned (a verify penalises them in place).
    """

    def __init__(self, pools: Pools, server_args: Any, model: Callable[[Any], torch.Tensor]):
        from sglang.srt.model_executor import model_runner as model_runner_module
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        runner = model_runner_for_forward_batch(pools, server_args)
        # What ModelRunner.__init__ sets that the worker's paths read: no graphs; the sliding
        # window (none in the config); 0.5.15's lazily derived linear-attention layout; the WAR
        # read-done event (0.5.15 and 0.5.23 name it apart); 0.5.23's watermark state (off); the
        # attention backend's verify buffers (none).
        runner.spec_algorithm, runner.decode_cuda_graph_runner = SpeculativeAlgorithm.EAGLE3, None
        runner.is_hybrid_swa = pools.model_config.is_hybrid_swa
        if hasattr(model_runner_module, "_UNSET"):
            runner._linear_attn_registry_cache = model_runner_module._UNSET
        runner.war_fastpath_read_done_event = runner.shared_read_done_event = runner.watermark_state = None
        runner.attn_backend = SimpleNamespace(
            verify_mask=None, get_verify_buffers_to_fill_after_draft=lambda: (None, None)
        )
        self.model_runner, self.model = runner, model
        self.seen: list[tuple[Any, torch.Tensor, torch.Tensor]] = []

    def forward_batch_generation(
        self, batch=None, forward_batch=None, pp_proxy_tensors=None, is_verify=False, *, capture_hidden_mode=None,
        return_kv_loc_plan=False,
    ):  # fmt: skip
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch
        from sglang.srt.model_executor.model_runner import ModelRunner

        if forward_batch is None:
            # 0.5.23's init_new is told the hidden-state capture the worker asks for.
            options = inspect.signature(ForwardBatch.init_new).parameters
            asks = {"capture_hidden_mode": capture_hidden_mode, "return_hidden_states_before_norm": False}
            forward_batch = ForwardBatch.init_new(
                batch, self.model_runner, **{k: v for k, v in asks.items() if k in options}
            )
        logits = self.model(forward_batch)
        self.seen.append((forward_batch, logits.clone(), logits))
        # EAGLE-3 captures three target layers: the draft extend reads [rows, 3 * hidden].
        output = LogitsProcessorOutput(next_token_logits=logits, hidden_states=torch.ones(logits.shape[0], 3 * HIDDEN))
        result = GenerationBatchResult(logits_output=output, can_run_cuda_graph=False)
        if return_kv_loc_plan:  # 0.5.23's draft extends write where the target's forward did
            result.kv_loc_plan = forward_batch.kv_loc_plan
        if not is_verify:
            ModelRunner._preprocess_logits(self.model_runner, output, forward_batch.sampling_info)
            result.next_token_ids = logits.argmax(-1)
        return result


class StandInDraft:
    """The draft worker, stood in for: it proposes `draft_tokens` (per request, after its pending
    token) as the tree `tree` (parents; a chain by default), and its extends fill the next draft
    input (top-k, hidden) in place with the shapes and dtypes the FutureMap relays, as
    EagleDraftWorker's do. Its TP is the target's: 0.5.15 enters draft_tp_context(tp_group), 0.5.23
    reads parallel_layout; the runner's WAR read-done event goes by both releases' names."""

    def __init__(self) -> None:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.parallel_layout = SimpleNamespace(tp_group=None)
        self.draft_runner = SimpleNamespace(
            tp_group=None, spec_algorithm=SpeculativeAlgorithm.EAGLE3, war_fastpath_read_done_event=None,
            shared_read_done_event=None, model_config=SimpleNamespace(spec_hidden_size=HIDDEN, dtype=torch.float32),
        )  # fmt: skip
        self.draft_tokens: Optional[List[List[int]]] = None
        self.tree: Optional[List[int]] = None

    def draft_tp_context(self, _group: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    @staticmethod
    def _fill(draft_input: Any, bs: int) -> None:
        draft_input.topk_p = torch.full((bs, TOPK), 1.0 / TOPK)
        draft_input.topk_index = torch.arange(TOPK).repeat(bs, 1) + 10
        draft_input.hidden_states = torch.randn(bs, HIDDEN)

    def draft(self, batch: Any):
        assert self.draft_tokens is not None, "the test chooses the draft tokens first"
        pending = batch.spec_info.bonus_tokens.long().unsqueeze(1)
        nodes = torch.cat([pending, torch.tensor(self.draft_tokens)], dim=1)
        return verify_input(nodes, batch.seq_lens, self.tree)

    def _draft_extend_for_prefill(self, batch, hidden_states, next_token_ids, mm_input_embeds=None, kv_loc_plan=None):
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        draft_input = EagleDraftInput(
            bonus_tokens=next_token_ids, num_tokens_per_req=1, num_tokens_for_logprob_per_req=1
        )
        self._fill(draft_input, len(batch.reqs))
        return draft_input

    def _draft_extend_for_decode(self, batch, batch_result, kv_loc_plan=None):
        self._fill(batch_result.next_draft_input, len(batch.reqs))


def spec_worker(target: StandInTarget, draft: StandInDraft, pools: Pools, server_args: Any):
    """SGLang's EAGLEWorkerV2 (object.__new__: no models) around the stand-ins, no adaptive controller."""
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    worker = object.__new__(EAGLEWorkerV2)
    worker._target_worker, worker._draft_worker = target, draft
    worker.adaptive_controller, worker.enable_dp_spec_prefill_coordination = None, False
    worker.topk, worker.device, worker.page_size = server_args.speculative_eagle_topk, "cpu", 1
    worker.speculative_num_steps = server_args.speculative_num_steps
    worker.speculative_num_draft_tokens = server_args.speculative_num_draft_tokens
    worker.speculative_algorithm = target.model_runner.spec_algorithm
    worker.plan_stream, worker.plan_stream_ctx = None, contextlib.nullcontext()
    worker.req_to_token_pool, worker.token_to_kv_pool_allocator = pools.req_to_token_pool, pools.allocator
    catch_up = sglang_module("sglang.srt.speculative.adaptive_draft_catch_up")
    if catch_up is not None:  # the lines' deferred draft catch-up: its debts, as __init__ sets them
        worker.draft_catch_up = catch_up.DraftCatchUp.for_server(server_args)
    return worker
