"""Tests for patches/0002-kimi-k25-eagle3-hooks.patch.

The wrapper under test is the real `KimiK25ForConditionalGeneration`; its language model
is a tiny real `DeepseekV3ForCausalLM` (the class the wrapper builds in `__init__`), made
without its heavy `__init__` and given just the submodules its EAGLE-3 hooks touch. Building
the whole wrapper would need the vision tower and the full model config, which the hooks
do not use.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

HOOKS = ("set_eagle3_layers_to_capture", "get_embed_and_head", "set_embed_and_head")
VOCAB, HIDDEN, NUM_LAYERS = 32, 8, 61


def _tiny_deepseek_v3():
    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM

    lm = DeepseekV3ForCausalLM.__new__(DeepseekV3ForCausalLM)
    nn.Module.__init__(lm)
    lm.config = SimpleNamespace(num_hidden_layers=NUM_LAYERS)
    lm.pp_group = SimpleNamespace(is_last_rank=True)
    lm.model = nn.Module()
    lm.model.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
    lm.model.layers_to_capture = []
    lm.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)
    lm.capture_aux_hidden_states = False
    return lm


def _kimi(language_model):
    from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration

    model = KimiK25ForConditionalGeneration.__new__(KimiK25ForConditionalGeneration)
    nn.Module.__init__(model)
    model.language_model = language_model
    return model


@pytest.mark.parametrize("name", HOOKS)
def test_hooks_defined_on_wrapper(name):
    from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration

    assert callable(vars(KimiK25ForConditionalGeneration).get(name))


def test_set_eagle3_layers_to_capture_delegates():
    lm = _tiny_deepseek_v3()
    model = _kimi(lm)

    model.set_eagle3_layers_to_capture([2, 30, 57])
    assert lm.capture_aux_hidden_states is True
    # DeepseekV2ForCausalLM shifts by one: layer i captures the output of layer i-1.
    assert lm.model.layers_to_capture == [3, 31, 58]

    model.set_eagle3_layers_to_capture()  # None -> the language model's default layers
    assert lm.model.layers_to_capture == [2, NUM_LAYERS // 2, NUM_LAYERS - 3]


def test_get_and_set_embed_and_head_delegate(monkeypatch):
    lm = _tiny_deepseek_v3()
    model = _kimi(lm)

    embed, head = model.get_embed_and_head()
    assert embed is lm.model.embed_tokens.weight
    assert head is lm.lm_head.weight

    # DeepseekV2ForCausalLM.set_embed_and_head synchronises CUDA; nothing to sync on CPU.
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    new_embed = nn.Parameter(torch.randn(VOCAB, HIDDEN))
    new_head = nn.Parameter(torch.randn(VOCAB, HIDDEN))
    assert model.set_embed_and_head(new_embed, new_head) is None
    assert lm.model.embed_tokens.weight is new_embed
    assert lm.lm_head.weight is new_head
    assert model.get_embed_and_head() == (new_embed, new_head)


class _TextModelWithoutHooks(nn.Module):
    pass


@pytest.mark.parametrize(
    "name, args",
    [
        ("set_eagle3_layers_to_capture", ([1, 2, 3],)),
        ("get_embed_and_head", ()),
        ("set_embed_and_head", (torch.zeros(1), torch.zeros(1))),
    ],
)
def test_clear_error_when_language_model_lacks_hook(name, args):
    model = _kimi(_TextModelWithoutHooks())
    with pytest.raises(AttributeError) as excinfo:
        getattr(model, name)(*args)
    message = str(excinfo.value)
    assert "_TextModelWithoutHooks" in message
    assert "language model" in message
    assert "EAGLE-3" in message


# The project's Kimi-K2.5-shaped fixture (bench/models/kimi_fixture.py) at a small width; MLA sizes are
# DeepSeek-V3's, as on the GPU.
def _small_kimi_params():
    from bench.models.kimi_fixture import KimiParams

    return KimiParams(
        hidden=256,
        heads=2,
        q_lora_rank=64,
        intermediate=512,
        moe_intermediate=64,
        draft_heads=2,
        draft_kv_heads=1,
        draft_intermediate=256,
    )


def _built_kimi(target, monkeypatch):
    """The real wrapper built from the fixture's config, every parameter NaN until loaded."""
    import sglang.srt.layers.rotary_embedding as rotary_embedding
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.dp_attention import initialize_dp_attention
    from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration

    import sglang_cpu

    args = sglang_cpu.make_server_args(
        target, attention_backend="triton", enable_dp_attention=False, dp_size=1, attn_cp_size=1, moe_dense_tp_size=None
    )
    sglang_cpu.init_single_rank_groups()
    config = ModelConfig(str(target))
    initialize_dp_attention(args, config)
    # SGLang's own torch rope on CPU (the GPU path imports a CUDA kernel at construction). The
    # flag lives in the module (0.5.9) or in each module of the package it became (0.5.10).
    for name, module in list(sys.modules.items()):
        if name.startswith(rotary_embedding.__name__) and hasattr(module, "_is_cpu"):
            monkeypatch.setattr(module, "_is_cpu", True)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = KimiK25ForConditionalGeneration(config.hf_config)
    finally:
        torch.set_default_dtype(default)
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(float("nan"))
    return model


def test_fixture_checkpoint_loads_into_the_real_model_and_its_hooks(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from bench.models import fixtures

    fx = fixtures.generate(_small_kimi_params(), tmp_path, quiet=True)
    target, draft = fx.pair("kimi-exact")
    model = _built_kimi(target, monkeypatch)
    model.load_weights(list(load_file(str(target / "model.safetensors")).items()))
    unloaded = [n for n, p in model.named_parameters() if torch.isnan(p).any()]
    assert not unloaded, f"the checkpoint leaves {len(unloaded)} parameters unloaded: {unloaded[:5]}"

    lm = model.language_model
    layers = lm.model.layers
    assert not any(layer.self_attn.o_proj.weight.any() for layer in layers), "exact: o_proj must be zero"
    assert not layers[0].mlp.down_proj.weight.any()
    assert not any(
        layer.mlp.experts.w2_weight.any() or layer.mlp.shared_experts.down_proj.weight.any() for layer in layers[1:]
    ), "exact: every expert's down_proj must be zero"

    # 0002's hooks on the fully built model: the layers the draft's fc takes, and its embedding/head.
    model.set_eagle3_layers_to_capture()
    assert lm.capture_aux_hidden_states and lm.model.layers_to_capture == [2, 4, 5]
    embed, head = model.get_embed_and_head()
    assert torch.equal(embed, head), "exact: lm_head = embed_tokens"
    vocab = json.loads((draft / "config.json").read_text())["vocab_size"]
    assert embed.shape[1] == json.loads((draft / "config.json").read_text())["hidden_size"]
    assert embed.shape[0] >= vocab
