"""EAGLE verify on CPU: a word-level tokenizer, chain-shaped verify inputs, and a torch reference
for sgl_kernel's verify_tree_greedy (the one native kernel on the greedy verify path).

The tokenizer is a real transformers fast tokenizer loaded through SGLang's own get_tokenizer:
token i is the word `w<i>`, so a test writes stop strings as words and knows their token ids.
"""

from __future__ import annotations

from pathlib import Path

import kernel_refs
import torch

from sglang_cpu import VOCAB


def word_tokenizer(path: Path):
    return kernel_refs.word_tokenizer(path, VOCAB)


def verify_tree_greedy(
    predicts,
    accept_index,
    accept_token_num,
    candidates,
    retrive_index,
    retrive_next_token,
    retrive_next_sibling,
    target_predict,
):
    """sgl_kernel.verify_tree_greedy, with the argument names SGLang 0.5.9 passes."""
    kernel_refs.greedy_tree_walk(
        predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
        retrive_next_sibling, target_predict,
    )  # fmt: skip


def use_torch_verify(monkeypatch) -> None:
    import sgl_kernel
    import sglang.srt.speculative.eagle_utils as eagle_utils

    monkeypatch.setattr(eagle_utils, "_is_cuda", True)
    monkeypatch.setattr(sgl_kernel, "verify_tree_greedy", verify_tree_greedy, raising=False)


def chain_verify_input(draft_tokens: torch.Tensor, seq_lens: torch.Tensor):
    """The EagleVerifyInput a topk-1 draft builds: per request a chain root -> d1 -> ... -> dk.

    Column 0 is the root (the last verified token); logits row b * D + j predict the token
    after draft position j.
    """
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    bs, num_draft = draft_tokens.shape
    local = torch.arange(num_draft)
    next_token = torch.where(local + 1 < num_draft, local + 1, -1).repeat(bs, 1)
    return EagleVerifyInput(
        draft_token=draft_tokens.reshape(-1).clone(),
        custom_mask=None,
        positions=(seq_lens.unsqueeze(1) + local).reshape(-1),
        retrive_index=(torch.arange(bs).unsqueeze(1) * num_draft + local),
        retrive_next_token=next_token,
        retrive_next_sibling=torch.full((bs, num_draft), -1),
        retrive_cum_len=None,
        spec_steps=num_draft - 1,
        topk=1,
        draft_token_num=num_draft,
        capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=int(seq_lens.sum()),
        seq_lens_cpu=seq_lens.cpu(),
    )


def logits_favouring(rows: int, token: int, margin: float = 10.0, seed: int = 0) -> torch.Tensor:
    """Random logits in [0, 1) with `token` ahead of every other by `margin`."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.rand(rows, VOCAB, generator=generator)
    logits[:, token] += margin
    return logits
