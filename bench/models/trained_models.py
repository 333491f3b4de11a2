"""The trained fixtures' models: the target (transformers' Llama), what EAGLE-3 captures from it, and
the checkpoints SGLang loads (the target extended by pass-through layers, the draft)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.models.eagle3_draft import DraftShape, Eagle3Draft, checkpoint_tensors
from bench.models.trained_params import TrainedParams, captured_layers


def llama_config(params: TrainedParams, vocab: int, layers: int, intermediate: int | None = None) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=params.hidden,
        intermediate_size=intermediate or params.intermediate,
        num_hidden_layers=layers,
        num_attention_heads=params.heads,
        num_key_value_heads=params.kv_heads,
        max_position_embeddings=params.max_positions,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        initializer_range=0.02,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype=params.dtype,
    )


def new_target(params: TrainedParams, vocab: int) -> Any:
    """The trainable part of the target: its trained layers only (the rest pass the residual through)."""
    import torch
    from transformers import LlamaForCausalLM

    with torch.device(params.device):
        model = LlamaForCausalLM(llama_config(params, vocab, params.trained_layers))
    return model


def target_states(model: Any, tokens: Any) -> tuple[list[Any], Any]:
    """The residual stream after 0..K trained layers ([B, T, H] each) and the logits, for tokens [B, T]."""
    after: list[Any] = []

    def keep(_module: Any, _inputs: Any, output: Any) -> None:
        after.append(output[0] if isinstance(output, tuple) else output)

    modules = [model.model.embed_tokens, *model.model.layers]
    hooks = [m.register_forward_hook(keep) for m in modules]
    try:
        logits = model(input_ids=tokens, use_cache=False).logits
    finally:
        for h in hooks:
            h.remove()
    return after, logits


def captured_features(states: list[Any], num_layers: int) -> Any:
    """What SGLang hands the draft: the states before each captured layer of a num_layers target
    whose first len(states)-1 layers are the trained ones, concatenated ([B, T, 3H])."""
    import torch

    trained = len(states) - 1
    return torch.cat([states[min(i, trained)] for i in captured_layers(num_layers)], -1)


def draft_shape(params: TrainedParams, vocab: int) -> DraftShape:
    return DraftShape(
        hidden=params.hidden,
        heads=params.heads,
        kv_heads=params.kv_heads,
        intermediate=params.draft_intermediate,
        vocab=vocab,
    )


def new_draft(params: TrainedParams, vocab: int, target: Any) -> Eagle3Draft:
    """A draft whose output head starts from the target's (norm and lm_head), which it then tunes."""
    import torch

    with torch.device(params.device):
        draft = Eagle3Draft(draft_shape(params, vocab))
    with torch.no_grad():
        for p in draft.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02)
        draft.lm_head.weight.copy_(target.lm_head.weight)
        draft.norm.weight.copy_(target.model.norm.weight)
    return draft


def extended_state(trained: dict[str, Any], params: TrainedParams, layers: int) -> dict[str, Any]:
    """The trained target's tensors (in params.dtype) plus pass-through layers up to `layers`: zero
    weights but the norms, so each adds nothing to the residual stream."""
    import torch

    dtype = getattr(torch, params.dtype)
    out = {k: v.detach().to("cpu", dtype).contiguous() for k, v in trained.items()}
    template = {k.split(".", 3)[3]: v for k, v in out.items() if k.startswith("model.layers.0.")}
    for i in range(params.trained_layers, layers):
        for name, t in template.items():
            fill = torch.ones if name.endswith("layernorm.weight") else torch.zeros
            out[f"model.layers.{i}.{name}"] = fill(t.shape, dtype=t.dtype)
    return out


def write_target(out: Path, state: dict[str, Any], params: TrainedParams, vocab: int, layers: int) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = llama_config(params, vocab, layers)
    cfg.architectures = ["LlamaForCausalLM"]  # SGLang picks the model class by it
    cfg.save_pretrained(str(out))


def write_draft(out: Path, draft: Eagle3Draft, params: TrainedParams, vocab: int) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(checkpoint_tensors(draft, params.dtype), str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = llama_config(params, vocab, 1, params.draft_intermediate).to_dict()
    cfg.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=vocab, target_hidden_size=params.hidden)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def parameter_count(params: TrainedParams, vocab: int, layers: int) -> int:
    h, kv = params.hidden, params.kv_heads * (params.hidden // params.heads)
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * params.intermediate + 2 * h
    return layers * per_layer + 2 * vocab * h + h


def draft_parameter_count(params: TrainedParams, vocab: int) -> int:
    h, kv = params.hidden, params.kv_heads * (params.hidden // params.heads)
    attn = 2 * h * h + 2 * 2 * h * kv + h * h  # q and k/v take 2H; o
    return 3 * h * h + attn + 3 * h * params.draft_intermediate + vocab * h + 4 * h
