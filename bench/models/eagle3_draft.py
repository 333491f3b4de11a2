"""An EAGLE-3 draft in plain torch, computing what SGLang's LlamaForCausalLMEagle3 computes, and
its training on a target's captured hidden states.

SGLang's draft (models/llama_eagle3.py): the target's three captured hidden states go through
``fc`` (3H -> H); the one layer normalises the token's embedding (``input_layernorm``) and that
state (``hidden_norm``), attends over their concatenation (q/k/v take 2H), adds the attention output
to the state, then runs a Llama MLP; ``norm`` and ``lm_head`` give the logits, and the pre-norm
state is what the next draft step takes instead of ``fc``'s output.

Training follows how SGLang drafts with topk 1. After a verify the draft extends over the accepted
positions with the target's states; at position p it takes token x[p+1] and predicts the target's
next token after it. Draft step k (k >= 2) then runs at position p+k-1 on its own previous state and
attends to the extend's keys at positions <= p and to its own keys of steps 2..k. The loss at step
k is the cross entropy against the target's distribution there, weighted by ``decay ** (k-1)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class DraftShape:
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    rope_theta: float = 10000.0
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.to(torch.promote_types(x.dtype, torch.float32))  # as SGLang's kernels: at least fp32
        out = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * self.weight.to(wide.dtype)).to(x.dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama's (neox-style) rotary embedding of x [B, heads, T, d] at positions [T]."""
    d = x.shape[-1]
    wide = torch.promote_types(x.dtype, torch.float32)
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=wide) / d))
    freqs = positions.to(wide)[:, None] * inv_freq[None, :]
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    rotated = torch.cat([-x2, x1], -1)
    return (x.to(wide) * cos + rotated.to(wide) * sin).to(x.dtype)


class _Attention(nn.Module):
    def __init__(self, s: DraftShape):
        super().__init__()
        h = s.hidden
        self.q_proj = nn.Linear(2 * h, s.heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * h, s.kv_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * h, s.kv_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.heads * s.head_dim, h, bias=False)


class _MLP(nn.Module):
    def __init__(self, s: DraftShape):
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.up_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.down_proj = nn.Linear(s.intermediate, s.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    def __init__(self, s: DraftShape):
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden, s.eps)
        self.hidden_norm = RMSNorm(s.hidden, s.eps)
        self.post_attention_layernorm = RMSNorm(s.hidden, s.eps)
        self.self_attn = _Attention(s)
        self.mlp = _MLP(s)


class Eagle3Draft(nn.Module):
    """Parameter names follow the checkpoint SGLang loads (``midlayer.*``, ``fc``, ``norm``, ``lm_head``)."""

    def __init__(self, shape: DraftShape):
        super().__init__()
        self.shape = shape
        self.fc = nn.Linear(3 * shape.hidden, shape.hidden, bias=False)
        self.midlayer = _MidLayer(shape)
        self.norm = RMSNorm(shape.hidden, shape.eps)
        self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False)

    def _qkv(self, embeds: torch.Tensor, state: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        layer, s = self.midlayer, self.shape
        x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(state)], -1)
        b, t, _ = x.shape

        def heads(proj: nn.Linear, n: int) -> torch.Tensor:
            return proj(x).view(b, t, n, s.head_dim).transpose(1, 2)

        q = rope(heads(layer.self_attn.q_proj, s.heads), positions, s.rope_theta)
        k = rope(heads(layer.self_attn.k_proj, s.kv_heads), positions, s.rope_theta)
        v = heads(layer.self_attn.v_proj, s.kv_heads)
        rep = s.heads // s.kv_heads
        return q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)

    def _finish(self, attn: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.midlayer
        b, _, t, _ = attn.shape
        residual = layer.self_attn.o_proj(attn.transpose(1, 2).reshape(b, t, -1)) + state
        x = layer.post_attention_layernorm(residual)
        residual = layer.mlp(x) + residual
        return self.lm_head(self.norm(residual)), residual

    def unrolled(self, embeds: list[torch.Tensor], features: torch.Tensor) -> list[torch.Tensor]:
        """Logits of each draft step for every anchor p (see the module doc).

        embeds[k-1]: [B, A, H], the embedding of the token step k takes at anchor p (x[p+k]);
        features: [B, A, 3H], the target's captured states at p. Step k runs at position p+k-1.
        """
        a = features.shape[1]
        anchors = torch.arange(a, device=features.device)
        causal = anchors[None, :] <= anchors[:, None]
        state = self.fc(features)
        scale = 1.0 / math.sqrt(self.shape.head_dim)
        logits, keys, values = [], None, None
        extra_k: list[torch.Tensor] = []
        extra_v: list[torch.Tensor] = []
        for k, emb in enumerate(embeds):
            q, key, value = self._qkv(emb, state, anchors + k)
            if keys is None:
                keys, values = key, value
            else:
                extra_k.append(key)
                extra_v.append(value)
            assert values is not None
            wide = torch.promote_types(q.dtype, torch.float32)
            main = (q @ keys.transpose(-1, -2) * scale).to(wide).masked_fill(~causal, float("-inf"))
            own = [((q * ek).sum(-1, keepdim=True) * scale).to(wide) for ek in extra_k]
            weights = torch.softmax(torch.cat([main, *own], -1), -1).to(q.dtype)
            attn = weights[..., :a] @ values
            for i, ev in enumerate(extra_v):
                attn = attn + weights[..., a + i : a + i + 1] * ev
            step_logits, state = self._finish(attn, state)
            logits.append(step_logits)
        return logits


@dataclass(frozen=True)
class DraftBatch:
    """One batch for the unrolled loss: token embeddings per step, features, target log-probs per step."""

    embeds: list[torch.Tensor]
    features: torch.Tensor
    target_logprobs: list[torch.Tensor]


def make_batch(
    tokens: torch.Tensor, embed: nn.Module, features: torch.Tensor, target_logits: torch.Tensor, steps: int
) -> DraftBatch:
    """tokens [B, T]; features [B, T, 3H] (captured at each position); target_logits [B, T, V] (the
    target's prediction of the token after each position). Anchors p = 0 .. T-steps-1."""
    a = tokens.shape[1] - steps
    embeds = [embed(tokens[:, k : k + a]) for k in range(1, steps + 1)]
    logprobs = [torch.log_softmax(target_logits[:, k : k + a].float(), -1) for k in range(1, steps + 1)]
    return DraftBatch(embeds, features[:, :a], logprobs)


def unrolled_loss(draft: Eagle3Draft, batch: DraftBatch, decay: float = 0.8) -> tuple[torch.Tensor, list[float]]:
    """The weighted soft cross entropy over the steps, and each step's top-1 agreement with the target."""
    logits = draft.unrolled(batch.embeds, batch.features)
    loss = torch.zeros((), device=batch.features.device)
    agreement = []
    for k, (lg, tgt) in enumerate(zip(logits, batch.target_logprobs, strict=True)):
        ce = -(tgt.exp() * torch.log_softmax(lg.float(), -1)).sum(-1).mean()
        loss = loss + decay**k * ce
        agreement.append(float((lg.argmax(-1) == tgt.argmax(-1)).float().mean()))
    return loss, agreement


def chain_accept_length(agreement: list[float]) -> float:
    """Expected tokens per verify with topk 1: the verified token plus each draft step while all agree."""
    total, alive = 1.0, 1.0
    for p in agreement:
        alive *= p
        total += alive
    return total


def checkpoint_tensors(draft: Eagle3Draft, dtype: str = "bfloat16") -> dict[str, Any]:
    """The draft's tensors as SGLang loads them: weights in `dtype`, identity vocabulary maps."""
    cast = getattr(torch, dtype)
    out: dict[str, Any] = {k: v.detach().to("cpu", cast).contiguous() for k, v in draft.state_dict().items()}
    vocab = draft.shape.vocab
    out["d2t"] = torch.zeros(vocab, dtype=torch.int64)
    out["t2d"] = torch.ones(vocab, dtype=torch.bool)
    return out
