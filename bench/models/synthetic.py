"""The synthetic fixture pairs' models (a Llama-shaped target and an EAGLE-3 draft drawn at random,
or the draft copying the target: the exact pair), which the Kimi-shaped set's draft shares."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.errors import BenchError

GENERATOR_VERSION = 2


@dataclass(frozen=True)
class FixtureParams:
    hidden: int = 512
    layers: int = 8
    heads: int = 8
    kv_heads: int = 4
    intermediate: int = 1536
    vocab: int = 4096  # BPE target size; the models use the tokenizer's actual size
    max_positions: int = 8192
    seed: int = 1234
    init_std: float = 0.02
    lm_head_scale: float = 4.0  # sharper random-target logits: fewer bf16 near-ties
    device: str = "cpu"  # where the target's weights are drawn ("cuda": another random stream)
    random_pair: bool = True  # also write target-random and draft-random

    def key(self) -> str:
        blob = json.dumps({"v": GENERATOR_VERSION, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


class FixtureError(BenchError):
    pass


# ---------------------------------------------------------------------------------------- models


def require_device(name: str) -> None:
    import torch

    device = torch.device(name)
    if device.type != "cpu" and not getattr(torch, device.type).is_available():
        raise FixtureError(
            f"fixture device {name!r} is not available here (the gpu-bound and trained presets need a GPU)"
        )


def _llama_config(params: FixtureParams, vocab: int, layers: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=params.hidden,
        intermediate_size=params.intermediate,
        num_hidden_layers=layers,
        num_attention_heads=params.heads,
        num_key_value_heads=params.kv_heads,
        max_position_embeddings=params.max_positions,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        initializer_range=params.init_std,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="bfloat16",
    )


def build_target(out: Path, params: FixtureParams, vocab: int, exact: bool, seed: int) -> Any:
    """Write a Llama target; return its input embedding (float32 on CPU, for the exact draft)."""
    import torch
    from transformers import LlamaForCausalLM

    require_device(params.device)
    torch.manual_seed(seed)
    with torch.device(params.device):
        model = LlamaForCausalLM(_llama_config(params, vocab, params.layers))
    with torch.no_grad():
        if exact:
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
            model.lm_head.weight.copy_(model.model.embed_tokens.weight)
        else:
            model.lm_head.weight.mul_(params.lm_head_scale)
    embed = model.model.embed_tokens.weight.detach().to("cpu", torch.float32).clone()
    # nn.Module.to itself: transformers' typed wrapper of it confuses mypy, and adds only quantization checks.
    torch.nn.Module.to(model, device=torch.device("cpu"), dtype=torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    return embed


def draft_state(params: FixtureParams, vocab: int, target_embed: Any, exact: bool, seed: int) -> dict[str, Any]:
    """EAGLE-3 draft tensors (names as SGLang's LlamaForCausalLMEagle3 loads them)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    h, inter = params.hidden, params.intermediate
    head_dim = h // params.heads
    q_out, kv_out = params.heads * head_dim, params.kv_heads * head_dim

    def rnd(*shape: int) -> Any:
        return torch.randn(*shape, generator=g) * params.init_std

    s: dict[str, Any] = {
        "midlayer.input_layernorm.weight": torch.ones(h),
        "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "midlayer.self_attn.q_proj.weight": rnd(q_out, 2 * h),
        "midlayer.self_attn.k_proj.weight": rnd(kv_out, 2 * h),
        "midlayer.self_attn.v_proj.weight": rnd(kv_out, 2 * h),
        "midlayer.self_attn.o_proj.weight": rnd(h, q_out),
        "midlayer.mlp.gate_proj.weight": rnd(inter, h),
        "midlayer.mlp.up_proj.weight": rnd(inter, h),
        "midlayer.mlp.down_proj.weight": rnd(h, inter),
        "norm.weight": torch.ones(h),
        "d2t": torch.zeros(vocab, dtype=torch.int64),
        "t2d": torch.ones(vocab, dtype=torch.bool),
    }
    if exact:
        s["fc.weight"] = torch.cat([torch.zeros(h, 2 * h), torch.eye(h)], dim=1)
        s["midlayer.self_attn.o_proj.weight"] = torch.zeros(h, q_out)
        s["midlayer.mlp.down_proj.weight"] = torch.zeros(h, inter)
        s["lm_head.weight"] = target_embed.clone()
    else:
        s["fc.weight"] = rnd(h, 3 * h)
        s["lm_head.weight"] = rnd(vocab, h) * params.lm_head_scale
    return s


def build_draft(out: Path, params: FixtureParams, vocab: int, target_embed: Any, exact: bool, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = draft_state(params, vocab, target_embed, exact, seed)
    tensors = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous() for k, v in state.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = _llama_config(params, vocab, 1).to_dict()
    cfg.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=vocab, target_hidden_size=params.hidden)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------- cache
