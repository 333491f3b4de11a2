"""A tiny Kimi-K2.5-shaped target (``KimiK25ForConditionalGeneration``: a MoonViT vision tower and a
DeepSeek-V3 text model with MLA attention and MoE layers) with EAGLE-3 drafts sized to it, in the
checkpoint layout SGLang 0.5.9 loads (``language_model.*``, ``vision_tower.*``, ``mm_projector.*``).

- ``target-kimi-exact``: every attention's ``o_proj``, every dense MLP's, routed expert's and shared
  expert's ``down_proj`` zero, ``lm_head = embed_tokens``: the residual stream is the token's
  embedding whatever the router picks, and greedy decoding repeats the last token.
- ``draft-kimi-exact``: the Llama fixture's exact draft at this hidden size (acceptance near 100%).
- ``target-kimi-random`` / ``draft-kimi-random``: random weights.

MLA sizes are DeepSeek-V3's own (kv_lora_rank 512, rope 64, nope 128, v 128): FlashInfer's MLA
kernels take only those. Pairs: ``kimi-exact``, ``kimi-random``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.models import tokenizer
from bench.models.synthetic import FixtureParams, build_draft

GENERATOR_VERSION = 1
KIMI_PAIRS = {
    "kimi-exact": ("target-kimi-exact", "draft-kimi-exact"),
    "kimi-random": ("target-kimi-random", "draft-kimi-random"),
}
MEDIA_PAD = "<|media_pad|>"  # the image placeholder SGLang's Kimi-K2.5 processor looks for

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KimiParams:
    hidden: int = 1024
    layers: int = 8  # EAGLE-3 captures layers 2, L/2 and L-3: they coincide below 7
    dense_layers: int = 1  # first_k_dense_replace, as Kimi-K2.5's first layer
    heads: int = 8
    q_lora_rank: int = 384
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    intermediate: int = 2048  # the dense layers' MLP
    moe_intermediate: int = 256
    routed_experts: int = 8
    experts_per_token: int = 2
    shared_experts: int = 1
    vision_hidden: int = 64
    vision_layers: int = 1
    vision_heads: int = 2
    patch_size: int = 14
    draft_heads: int = 8
    draft_kv_heads: int = 4
    draft_intermediate: int = 2048
    vocab: int = 4096  # BPE target size; the models use the tokenizer's actual size
    max_positions: int = 8192
    seed: int = 1234
    init_std: float = 0.02
    lm_head_scale: float = 4.0

    def key(self) -> str:
        blob = json.dumps({"v": GENERATOR_VERSION, "kind": "kimi", **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def text_config(p: KimiParams, vocab: int) -> dict[str, Any]:
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": vocab,
        "hidden_size": p.hidden,
        "intermediate_size": p.intermediate,
        "moe_intermediate_size": p.moe_intermediate,
        "num_hidden_layers": p.layers,
        "num_attention_heads": p.heads,
        "num_key_value_heads": p.heads,
        "n_shared_experts": p.shared_experts,
        "n_routed_experts": p.routed_experts,
        "num_experts_per_tok": p.experts_per_token,
        "first_k_dense_replace": p.dense_layers,
        "moe_layer_freq": 1,
        "q_lora_rank": p.q_lora_rank,
        "kv_lora_rank": p.kv_lora_rank,
        "qk_nope_head_dim": p.qk_nope_head_dim,
        "qk_rope_head_dim": p.qk_rope_head_dim,
        "v_head_dim": p.v_head_dim,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "max_position_embeddings": p.max_positions,
        "rms_norm_eps": 1e-6,
        "rope_theta": 50000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
        # Kimi-K2's YaRN scaling, at this model's length
        "rope_scaling": {
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": p.max_positions // 4,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    }


def kimi_config(p: KimiParams, vocab: int, media_pad_id: int) -> dict[str, Any]:
    vision = {
        "patch_size": p.patch_size,
        "init_pos_emb_height": 8,
        "init_pos_emb_width": 8,
        "init_pos_emb_time": 4,
        "num_attention_heads": p.vision_heads,
        "num_hidden_layers": p.vision_layers,
        "hidden_size": p.vision_hidden,
        "vt_hidden_size": p.vision_hidden,
        "intermediate_size": 2 * p.vision_hidden,
        "merge_kernel_size": [2, 2],
        "mm_hidden_size": p.vision_hidden,
        "text_hidden_size": p.hidden,
    }
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text_config(p, vocab),
        "vision_config": vision,
        "media_placeholder_token_id": media_pad_id,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    }


class _Draw:
    """Deterministic random tensors, std init_std."""

    def __init__(self, seed: int, std: float) -> None:
        import torch

        self.g, self.std = torch.Generator().manual_seed(seed), std

    def __call__(self, *shape: int) -> Any:
        import torch

        return torch.randn(*shape, generator=self.g) * self.std


def _mlp(prefix: str, draw: _Draw, hidden: int, inter: int, exact: bool) -> dict[str, Any]:
    import torch

    return {
        f"{prefix}.gate_proj.weight": draw(inter, hidden),
        f"{prefix}.up_proj.weight": draw(inter, hidden),
        f"{prefix}.down_proj.weight": torch.zeros(hidden, inter) if exact else draw(hidden, inter),
    }


def language_state(p: KimiParams, vocab: int, exact: bool, draw: _Draw) -> dict[str, Any]:
    """DeepSeek-V3's checkpoint names under ``language_model.`` (SGLang fuses q_a and kv_a itself)."""
    import torch

    h, heads = p.hidden, p.heads
    s: dict[str, Any] = {"model.embed_tokens.weight": draw(vocab, h), "model.norm.weight": torch.ones(h)}
    for i in range(p.layers):
        a = f"model.layers.{i}"
        s.update(
            {
                f"{a}.input_layernorm.weight": torch.ones(h),
                f"{a}.post_attention_layernorm.weight": torch.ones(h),
                f"{a}.self_attn.q_a_proj.weight": draw(p.q_lora_rank, h),
                f"{a}.self_attn.q_a_layernorm.weight": torch.ones(p.q_lora_rank),
                f"{a}.self_attn.q_b_proj.weight": draw(
                    heads * (p.qk_nope_head_dim + p.qk_rope_head_dim), p.q_lora_rank
                ),
                f"{a}.self_attn.kv_a_proj_with_mqa.weight": draw(p.kv_lora_rank + p.qk_rope_head_dim, h),
                f"{a}.self_attn.kv_a_layernorm.weight": torch.ones(p.kv_lora_rank),
                f"{a}.self_attn.kv_b_proj.weight": draw(heads * (p.qk_nope_head_dim + p.v_head_dim), p.kv_lora_rank),
                f"{a}.self_attn.o_proj.weight": torch.zeros(h, heads * p.v_head_dim)
                if exact
                else draw(h, heads * p.v_head_dim),
            }
        )
        if i < p.dense_layers:
            s.update(_mlp(f"{a}.mlp", draw, h, p.intermediate, exact))
            continue
        s[f"{a}.mlp.gate.weight"] = draw(p.routed_experts, h)
        s[f"{a}.mlp.gate.e_score_correction_bias"] = torch.zeros(p.routed_experts)
        for e in range(p.routed_experts):
            s.update(_mlp(f"{a}.mlp.experts.{e}", draw, h, p.moe_intermediate, exact))
        s.update(_mlp(f"{a}.mlp.shared_experts", draw, h, p.moe_intermediate * p.shared_experts, exact))
    s["lm_head.weight"] = s["model.embed_tokens.weight"].clone() if exact else draw(vocab, h) * p.lm_head_scale
    return {f"language_model.{k}": v for k, v in s.items()}


def vision_state(p: KimiParams, draw: _Draw) -> dict[str, Any]:
    """MoonViT and its projector, in the names of Kimi-K2.5's checkpoint (wqkv, wo, proj.0/proj.2)."""
    import torch

    v, merged = p.vision_hidden, p.vision_hidden * 4  # the projector sees 2x2 merged patches
    s: dict[str, Any] = {
        "vision_tower.patch_embed.proj.weight": draw(v, 3, p.patch_size, p.patch_size),
        "vision_tower.patch_embed.proj.bias": torch.zeros(v),
        "vision_tower.patch_embed.pos_emb.weight": draw(8, 8, v),
        "vision_tower.encoder.final_layernorm.weight": torch.ones(v),
        "vision_tower.encoder.final_layernorm.bias": torch.zeros(v),
        "mm_projector.pre_norm.weight": torch.ones(v),
        "mm_projector.pre_norm.bias": torch.zeros(v),
        "mm_projector.proj.0.weight": draw(merged, merged),
        "mm_projector.proj.0.bias": torch.zeros(merged),
        "mm_projector.proj.2.weight": draw(p.hidden, merged),
        "mm_projector.proj.2.bias": torch.zeros(p.hidden),
    }
    for i in range(p.vision_layers):
        b = f"vision_tower.encoder.blocks.{i}"
        for norm in ("norm0", "norm1"):
            s[f"{b}.{norm}.weight"], s[f"{b}.{norm}.bias"] = torch.ones(v), torch.zeros(v)
        s.update(
            {
                f"{b}.mlp.fc0.weight": draw(2 * v, v),
                f"{b}.mlp.fc0.bias": torch.zeros(2 * v),
                f"{b}.mlp.fc1.weight": draw(v, 2 * v),
                f"{b}.mlp.fc1.bias": torch.zeros(v),
                f"{b}.wqkv.weight": draw(3 * v, v),
                f"{b}.wqkv.bias": torch.zeros(3 * v),
                f"{b}.wo.weight": draw(v, v),
                f"{b}.wo.bias": torch.zeros(v),
            }
        )
    return s


def _write_target(out: Path, p: KimiParams, vocab: int, media_pad_id: int, exact: bool, seed: int) -> Any:
    """Write one target; return its input embedding (float32, for the exact draft)."""
    import torch
    from safetensors.torch import save_file

    draw = _Draw(seed, p.init_std)
    state = {**vision_state(p, draw), **language_state(p, vocab, exact, draw)}
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.to(torch.bfloat16).contiguous() for k, v in state.items()},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (out / "config.json").write_text(
        json.dumps(kimi_config(p, vocab, media_pad_id), indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    return state["language_model.model.embed_tokens.weight"].float()


def build(tmp: Path, p: KimiParams, quiet: bool) -> dict[str, Any]:
    """The Kimi-shaped set into tmp; returns the manifest."""
    tokdir = tmp / "tokenizer"
    vocab = tokenizer.build_tokenizer(tokdir, p.vocab, tokenizer.tokenizer_text(p.seed), extra_special=[MEDIA_PAD])
    media_pad_id = len(tokenizer.SPECIAL_TOKENS)
    draft = FixtureParams(
        hidden=p.hidden,
        heads=p.draft_heads,
        kv_heads=p.draft_kv_heads,
        intermediate=p.draft_intermediate,
        max_positions=p.max_positions,
        init_std=p.init_std,
        lm_head_scale=p.lm_head_scale,
    )
    embed = None
    for kind, exact, seed in (("exact", True, p.seed), ("random", False, p.seed + 1)):
        if not quiet:
            logger.info(
                f"fixtures: writing target-kimi-{kind} (MLA + {p.routed_experts} experts, H={p.hidden}, "
                f"L={p.layers}, V={vocab})"
            )
        target_embed = _write_target(tmp / f"target-kimi-{kind}", p, vocab, media_pad_id, exact, seed)
        embed = target_embed if exact else embed
        build_draft(tmp / f"draft-kimi-{kind}", draft, vocab, embed, exact, seed + 2)
    tokenizer.copy_tokenizer(tokdir, tmp, KIMI_PAIRS)
    return {"params": dataclasses.asdict(p), "key": p.key(), "kind": "kimi", "vocab": vocab, "pairs": KIMI_PAIRS}
