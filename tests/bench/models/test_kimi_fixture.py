"""The Kimi-K2.5-shaped fixture's generator on CPU at a small width (bench/kimi_fixture.py). That its
checkpoint loads into SGLang's real KimiK25ForConditionalGeneration is checked with 0002's tests
(tests/patches/test_kimi_k25_eagle3.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.models import fixtures
from bench.models.kimi_fixture import KIMI_PAIRS, MEDIA_PAD, KimiParams

SMALL = KimiParams(
    hidden=256,
    heads=2,
    q_lora_rank=64,
    intermediate=512,
    moe_intermediate=64,
    draft_heads=2,
    draft_kv_heads=1,
    draft_intermediate=256,
)


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> fixtures.Fixtures:
    return fixtures.generate(SMALL, tmp_path_factory.mktemp("kimi"), quiet=True)


def test_pairs_and_the_wrapper_config(fx: fixtures.Fixtures) -> None:
    assert fx.pairs() == KIMI_PAIRS and fixtures.default_pair("kimi") == "kimi-exact"
    cfg = json.loads((fx.path("target-kimi-exact") / "config.json").read_text())
    assert cfg["architectures"] == ["KimiK25ForConditionalGeneration"] and cfg["model_type"] == "kimi_k25"
    text = cfg["text_config"]
    assert (text["kv_lora_rank"], text["qk_rope_head_dim"]) == (512, 64), "FlashInfer's MLA sizes"
    assert text["first_k_dense_replace"] == 1 and text["n_routed_experts"] == SMALL.routed_experts


def test_the_media_placeholder_is_one_token(fx: fixtures.Fixtures) -> None:
    from transformers import AutoTokenizer

    target = fx.path("target-kimi-exact")
    tok = AutoTokenizer.from_pretrained(str(target))
    pad_id = json.loads((target / "config.json").read_text())["media_placeholder_token_id"]
    assert tok.convert_tokens_to_ids(MEDIA_PAD) == pad_id
    assert tok(f"a{MEDIA_PAD}b", add_special_tokens=False)["input_ids"].count(pad_id) == 1


def test_exact_and_random_targets_differ_where_they_should(fx: fixtures.Fixtures) -> None:
    import torch
    from safetensors.torch import load_file

    exact = load_file(str(fx.path("target-kimi-exact") / "model.safetensors"))
    rand = load_file(str(fx.path("target-kimi-random") / "model.safetensors"))
    assert set(exact) == set(rand)
    lm = "language_model."
    assert torch.equal(exact[lm + "lm_head.weight"], exact[lm + "model.embed_tokens.weight"])
    zero = [k for k in exact if k.endswith(("o_proj.weight", "down_proj.weight")) and k.startswith(lm)]
    assert len(zero) == SMALL.layers + SMALL.dense_layers + (SMALL.layers - SMALL.dense_layers) * (
        SMALL.routed_experts + 1
    )
    assert not any(exact[k].any() for k in zero) and all(rand[k].any() for k in zero)
    draft = json.loads((fx.path("draft-kimi-exact") / "config.json").read_text())
    assert draft["architectures"] == ["LlamaForCausalLMEagle3"] and draft["target_hidden_size"] == SMALL.hidden


def test_the_set_is_cached_by_its_parameters(fx: fixtures.Fixtures, tmp_path: Path) -> None:
    assert fx.root.name == SMALL.key() != KimiParams().key()
    assert fixtures.generate(SMALL, fx.root.parents[1], quiet=True).root == fx.root
