"""Prompts on which greedy decoding meets no near-tie, for the greedy-equality tests.

Two servers of one model round differently (kernels are chosen by batch shape: a verify over 4 rows
against a one-token decode). On the H200, 5 of 479 greedy outputs of the trained target flipped
where two tokens' log-probabilities lay 5e-5 to 4e-4 nats apart (float32 logits, 2026-12-02). Where the
chosen token leads the runner-up by far more than that at every step, both servers decode the same
text, so a difference between them is a bug and not rounding.

`greedy_margins` decodes each prompt as the tests' servers do (greedy, a fixed number of tokens, end
of text ignored) with the weights rounded to the dtype they are served in and float32 arithmetic,
and returns each path's least lead of the chosen token over the runner-up, in nats.
`most_tie_free` keeps the prompts whose least lead is largest.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ScoredPrompt:
    text: str
    least_margin: float  # nats: the chosen token's log-probability over the runner-up's, at the closest step


def served_copy(model: Any, dtype: str) -> Any:
    """The model as a server holds it (weights rounded to dtype), computing in float32."""
    import torch

    served = copy.deepcopy(model).float().eval()
    with torch.no_grad():
        for p in served.parameters():
            p.copy_(p.to(getattr(torch, dtype)).float())
    return served


def _least_margins(model: Any, rows: list[list[int]], new_tokens: int, device: str) -> list[float]:
    """Rows of one length: the prompts' forward, then new_tokens greedy steps on the KV cache."""
    import torch

    ids = torch.tensor(rows, device=device)
    least = torch.full((len(rows),), float("inf"), device=device)
    out = model(input_ids=ids, use_cache=True)
    for step in range(new_tokens):
        top2 = torch.log_softmax(out.logits[:, -1].float(), -1).topk(2, -1)
        least = torch.minimum(least, top2.values[:, 0] - top2.values[:, 1])
        if step + 1 < new_tokens:  # the last token's successor is never scored
            out = model(input_ids=top2.indices[:, :1], past_key_values=out.past_key_values, use_cache=True)
    return [float(v) for v in least.cpu()]


def greedy_margins(model: Any, rows: list[list[int]], new_tokens: int, device: str, batch: int = 64) -> list[float]:
    """Each row's least greedy margin over new_tokens steps (rows: prompts as token ids)."""
    import torch

    if new_tokens < 1 or any(not r for r in rows):
        raise ValueError("greedy margins need at least one new token and no empty prompt")
    # Batched by length, so nothing is padded: no mask whose fully masked rows a kernel could turn into NaN.
    by_length: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        by_length.setdefault(len(r), []).append(i)
    margins = [0.0] * len(rows)
    with torch.inference_mode():
        for same in by_length.values():
            for start in range(0, len(same), batch):
                chunk = same[start : start + batch]
                got = _least_margins(model, [rows[i] for i in chunk], new_tokens, device)
                for i, m in zip(chunk, got, strict=True):
                    margins[i] = m
    return margins


def most_tie_free(prompts: list[str], margins: list[float], count: int) -> list[ScoredPrompt]:
    """The count prompts with the largest least margins, in their original order."""
    if len(prompts) != len(margins) or count > len(prompts):
        raise ValueError(f"{count} prompts asked of {len(prompts)} candidates with {len(margins)} margins")
    ranked = sorted(range(len(prompts)), key=lambda i: (-margins[i], i))[:count]
    return [ScoredPrompt(prompts[i], margins[i]) for i in sorted(ranked)]
