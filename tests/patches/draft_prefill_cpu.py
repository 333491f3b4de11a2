"""The draft's model runner for CPU tests of its prefill extend: what ForwardBatch.init_new reads
of a runner, and an EAGLE-3-shaped forward through SGLang's own LogitsProcessor."""

from __future__ import annotations

import types
from typing import Any

import torch

from sglang_cpu import HIDDEN, VOCAB


class DraftRunner:
    """The model runner fields ForwardBatch.init_new reads, and an EAGLE-3-shaped forward."""

    def __init__(self, env, vocab: int):
        from sglang.srt.layers.logits_processor import LogitsProcessor
        from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead
        from sglang.srt.server_args import get_global_server_args

        torch.manual_seed(0)
        self.req_to_token_pool = env.req_to_token_pool
        self.token_to_kv_pool = env.kv_pool
        self.attn_backend = None
        self.device = "cpu"
        self.server_args = get_global_server_args()
        self.token_to_kv_pool_allocator = env.allocator
        # Model features these batches do not use (later releases read them too).
        self.model_is_mrope = False
        self.use_ngram_embedding = False
        self.is_hybrid_swa = False
        self.is_draft_worker = True
        config = types.SimpleNamespace(vocab_size=vocab, hidden_size=HIDDEN)
        self.logits_processor = LogitsProcessor(config)
        self.lm_head = ParallelLMHead(vocab, HIDDEN)
        torch.nn.init.normal_(self.lm_head.weight)
        self.embed = torch.randn(VOCAB, HIDDEN)
        self.to_aux = torch.randn(HIDDEN, 3 * HIDDEN)
        self.forward_batches: list[Any] = []

    def forward(self, forward_batch):
        self.forward_batches.append(forward_batch)
        hidden = self.embed[forward_batch.input_ids.long()]
        aux = hidden @ self.to_aux
        logits_output = self.logits_processor(forward_batch.input_ids, hidden, self.lm_head, forward_batch, [aux])
        return types.SimpleNamespace(logits_output=logits_output, aux=aux)
