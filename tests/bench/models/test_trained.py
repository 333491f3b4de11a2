"""The trained fixtures' generator on CPU, at toy sizes: corpus, training, the pass-through targets,
the draft's unrolled attention and its checkpoint (what runs on the GPU machine at full size)."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from pathlib import Path
from typing import Any

import pytest
from bench_helpers import DRAFT_NAMES

from bench.models import fixtures
from bench.models.corpus import CorpusError, code_corpus, code_prompts, source_files
from bench.models.trained_params import TrainedParams, TrainingError, captured_layers
from bench.run import settings as run_settings

TOY = TrainedParams(
    hidden=64,
    heads=4,
    kv_heads=2,
    intermediate=128,
    draft_intermediate=64,
    vocab=300,
    corpus_bytes=300_000,
    seq_len=64,
    batch=8,
    target_steps=80,
    draft_steps=40,
    target_lr=3e-3,
    gpu_bound_layers=12,
    prompt_count=16,
    prompt_candidates=40,
    prompt_new_tokens=8,
    device="cpu",
)
CUDNN_ATTENTION_WARNING = (  # the warning of the 2026-12-02 generation on the H200
    "cuDNN Attention defaults to a non-deterministic algorithm. To explicitly enable determinism call "
    "torch.use_deterministic_algorithms(True, warn_only=False)."
)


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> fixtures.Fixtures:
    return fixtures.generate(TOY, tmp_path_factory.mktemp("trained"), quiet=True)


def _manifest(fx: fixtures.Fixtures) -> dict[str, Any]:
    return json.loads((fx.root / "manifest.json").read_text())


def test_corpus_is_sorted_whole_files_cut_at_the_budget(tmp_path: Path) -> None:
    for rel, text in {
        "b/mod.py": "B = 2\n",
        "a.py": "A = 1\n",
        "tests/t.py": "T\n",
        "b/test/x.py": "X\n",
        "c.txt": "not python\n",
        "d.py": "D" * 50,
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert [p.relative_to(tmp_path).as_posix() for p in source_files(tmp_path)] == ["a.py", "b/mod.py", "d.py"]
    c = code_corpus(20, tmp_path)
    assert c.text == "A = 1\nB = 2\n" + "D" * 8 and c.files == ("a.py", "b/mod.py", "d.py") and c.size == 20
    assert code_corpus(20, tmp_path).digest == c.digest != code_corpus(19, tmp_path).digest
    with pytest.raises(CorpusError, match="no Python sources"):
        code_corpus(10, tmp_path / "b" / "test" / "nothing")


def test_a_set_holds_both_targets_and_one_draft(fx: fixtures.Fixtures) -> None:
    assert fx.pairs() == {
        "trained": ("target-trained", "draft-trained"),
        "trained-gpu-bound": ("target-trained-gpu-bound", "draft-trained"),
    }
    for name in ("target-trained", "target-trained-gpu-bound", "draft-trained"):
        for f in ("config.json", "tokenizer.json", "model.safetensors"):
            assert (fx.path(name) / f).is_file(), f"{name}/{f}"
    layers = {
        n: json.loads((fx.path(n) / "config.json").read_text())["num_hidden_layers"]
        for n in ("target-trained", "target-trained-gpu-bound")
    }
    assert layers == {"target-trained": TOY.small_layers, "target-trained-gpu-bound": TOY.gpu_bound_layers}
    for name in ("target-trained", "target-trained-gpu-bound"):
        assert json.loads((fx.path(name) / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    m = _manifest(fx)
    assert m["key"] == TOY.key() == fx.root.name and m["kind"] == "trained"
    assert m["captured_layers"] == {"8": [2, 4, 5], "12": [2, 6, 9]}
    assert 0 < m["draft_to_target_weights"] < 1


def test_the_target_learned_and_the_draft_follows_it(fx: fixtures.Fixtures) -> None:
    figures = _manifest(fx)["figures"]
    vocab = _manifest(fx)["vocab"]
    assert figures["target_loss"] < math.log(vocab) - 1.0, "the target learned less than the unigram statistics"
    assert len(figures["draft_agreement"]) == TOY.draft_unroll
    assert all(0.0 <= a <= 1.0 for a in figures["draft_agreement"])
    assert 1.0 <= figures["draft_expected_accept_length"] <= 1 + TOY.draft_unroll


def _logits(path: Path, tokens: Any) -> Any:
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(path), torch_dtype=torch.float32)
    with torch.no_grad():
        return model(input_ids=tokens).logits


def test_pass_through_layers_leave_the_outputs_unchanged(fx: fixtures.Fixtures) -> None:
    import torch
    from safetensors.torch import load_file

    tokens = torch.randint(3, _manifest(fx)["vocab"], (2, 24), generator=torch.Generator().manual_seed(0))
    small, deep = _logits(fx.path("target-trained"), tokens), _logits(fx.path("target-trained-gpu-bound"), tokens)
    assert torch.equal(small, deep)
    weights = load_file(str(fx.path("target-trained-gpu-bound") / "model.safetensors"))
    last = TOY.gpu_bound_layers - 1
    assert not weights[f"model.layers.{last}.mlp.down_proj.weight"].any()
    assert not weights[f"model.layers.{last}.self_attn.o_proj.weight"].any()
    assert weights["model.layers.0.mlp.down_proj.weight"].any(), "the trained layers are not zero"


def test_code_prompts_are_distinct_whole_lines_spread_over_the_text() -> None:
    text = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(40))
    got = code_prompts(text, 10, lines=2)
    assert len(got) == len(set(got)) == 10
    assert all(p.startswith("def f") and p.endswith("\n") and p.count("\n") == 2 for p in got)
    assert got[0].startswith("def f0(") and got[-1].startswith("def f36("), "spread over the whole text"
    capped = code_prompts(text, 3, lines=6, max_chars=20)
    assert all(len(p) <= 20 and p.endswith("\n") for p in capped) and capped[0] == "def f0(x):\n", (
        "whole lines within the cap"
    )
    cut = code_prompts(text, 3, max_chars=9)
    assert all(len(p) == 9 and any(row.startswith(p) for row in text.splitlines()) for p in cut), (
        "a long first line is cut"
    )
    with pytest.raises(CorpusError, match="fewer than the 50 asked"):
        code_prompts("a\nb\n" * 20, 50)


def test_the_set_holds_held_out_code_prompts(fx: fixtures.Fixtures) -> None:
    from bench.run import client

    path = fx.prompts_file()
    assert path is not None and _manifest(fx)["prompts"]["count"] == TOY.prompt_count
    prompts = client.load_prompts(path)
    assert len(set(prompts)) == TOY.prompt_count and all(p.strip() for p in prompts)
    corpus = code_corpus(TOY.corpus_bytes)
    tail = corpus.text[int(len(corpus.text) * 0.9) :]  # the held-out 2% of tokens lies well inside the last 10% of text
    assert all(p in tail for p in prompts), "every prompt is held-out text"
    assert fixtures.Fixtures(fx.root / "tokenizer").prompts_file() is None, "a set without a manifest has none"


def test_the_prompts_are_the_candidates_furthest_from_a_greedy_tie(fx: fixtures.Fixtures) -> None:
    import torch
    from bench_helpers import stepwise_greedy_margin
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    path = fx.prompts_file()
    assert path is not None
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    entry = _manifest(fx)["prompts"]
    assert (entry["candidates"], entry["new_tokens"]) == (TOY.prompt_candidates, TOY.prompt_new_tokens)
    assert entry["least_margin"] == pytest.approx(min(r["least_margin"] for r in rows), abs=1e-6)
    # The served checkpoint (float16, pass-through layers included) in float32, decoded step by step.
    target = LlamaForCausalLM.from_pretrained(str(fx.path("target-trained")), torch_dtype=torch.float32).eval()
    tok = PreTrainedTokenizerFast.from_pretrained(str(fx.path("target-trained")))
    for r in rows:
        ids = tok(r["prompt"], add_special_tokens=False)["input_ids"]
        assert stepwise_greedy_margin(target, ids, TOY.prompt_new_tokens) == pytest.approx(r["least_margin"], abs=1e-4)
    assert entry["least_margin"] > 0.0


def test_draft_checkpoint_is_what_sglang_loads(fx: fixtures.Fixtures) -> None:
    from safetensors.torch import load_file

    cfg = json.loads((fx.path("draft-trained") / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == _manifest(fx)["vocab"] and cfg["target_hidden_size"] == TOY.hidden
    weights = load_file(str(fx.path("draft-trained") / "model.safetensors"))
    assert set(weights) == DRAFT_NAMES
    h = TOY.hidden
    assert tuple(weights["fc.weight"].shape) == (h, 3 * h)
    assert tuple(weights["midlayer.self_attn.q_proj.weight"].shape) == (h, 2 * h)
    assert tuple(weights["midlayer.mlp.down_proj.weight"].shape) == (h, TOY.draft_intermediate)
    assert not weights["d2t"].any() and bool(weights["t2d"].all())


def test_checkpoints_are_in_the_served_dtype(fx: fixtures.Fixtures) -> None:
    import torch
    from safetensors.torch import load_file

    for name in ("target-trained", "target-trained-gpu-bound", "draft-trained"):
        cfg = json.loads((fx.path(name) / "config.json").read_text())
        assert cfg.get("torch_dtype", cfg.get("dtype")) == TOY.dtype == "float16"  # transformers 4.57 writes "dtype"
        weights = load_file(str(fx.path(name) / "model.safetensors"))
        floats = {t.dtype for t in weights.values() if t.is_floating_point()}
        assert floats == {torch.float16}, f"{name}: {floats}"
    with pytest.raises(TrainingError, match="float16 or bfloat16"):
        dataclasses.replace(TOY, dtype="float32").check()


def test_the_training_text_keeps_blank_lines() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from bench.models.corpus import Corpus
    from bench.models.trained import tokenize

    text = "def a():\n    return 1\n\n\nclass B:\n    pass\n" * 3
    chars = sorted(set(text))
    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token=text[0]))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    corpus = Corpus(root=Path("."), files=("x.py",), text=text, digest="")
    assert "".join(chars[i] for i in tokenize(corpus, fast).tolist()) == text


def test_the_draft_trains_on_the_states_sglang_captures() -> None:
    import torch

    from bench.models.trained_models import captured_features

    states = [torch.full((1, 2, 3), float(k)) for k in range(3)]  # after 0, 1, 2 trained layers
    assert captured_layers(8) == [2, 4, 5]
    assert captured_features(states, 8)[0, 0].tolist() == [2.0] * 9, "every capture is after the trained layers"
    states = [torch.full((1, 2, 3), float(k)) for k in range(5)]  # four trained layers
    assert captured_features(states, 12)[0, 0].tolist() == [2.0] * 3 + [4.0] * 6


def test_unrolled_attention_matches_a_step_by_step_draft() -> None:
    """Step k at anchor p attends the extend's keys at positions <= p and its own keys of steps 2..k:
    checked against running the draft one anchor at a time with explicit key lists."""
    import torch

    from bench.models.eagle3_draft import DraftShape, Eagle3Draft, rope

    torch.manual_seed(0)
    shape = DraftShape(hidden=16, heads=4, kv_heads=2, intermediate=32, vocab=20)
    draft = Eagle3Draft(shape).double()
    a, steps = 5, 3
    embeds = [torch.randn(1, a, 16, dtype=torch.float64) for _ in range(steps)]
    features = torch.randn(1, a, 48, dtype=torch.float64)
    got = draft.unrolled(embeds, features)

    layer, d = draft.midlayer, shape.head_dim

    def qkv(e: Any, s: Any, pos: int) -> tuple[Any, Any, Any]:
        x = torch.cat([layer.input_layernorm(e), layer.hidden_norm(s)], -1)
        q = layer.self_attn.q_proj(x).view(shape.heads, 1, d)
        k = layer.self_attn.k_proj(x).view(shape.kv_heads, 1, d).repeat_interleave(2, 0)
        v = layer.self_attn.v_proj(x).view(shape.kv_heads, 1, d).repeat_interleave(2, 0)
        p = torch.tensor([pos])
        return rope(q, p, shape.rope_theta), rope(k, p, shape.rope_theta), v

    ext_state = draft.fc(features[0])
    ext = [qkv(embeds[0][0, j], ext_state[j], j) for j in range(a)]
    for p in range(a):
        state, keys, values = ext_state[p], [ext[j][1] for j in range(p + 1)], [ext[j][2] for j in range(p + 1)]
        for k in range(steps):
            q, key, value = ext[p] if k == 0 else qkv(embeds[k][0, p], state, p + k)
            if k:
                keys, values = keys + [key], values + [value]
            kk, vv = torch.cat(keys, 1), torch.cat(values, 1)
            w = torch.softmax(q @ kk.transpose(-1, -2) / math.sqrt(d), -1)
            attn = (w @ vv).view(1, 1, shape.heads, 1, d).squeeze(0).transpose(1, 2)
            logits, state = draft._finish(attn.reshape(1, shape.heads, 1, d), state.view(1, 1, -1))
            state = state.view(-1)
            assert torch.allclose(logits.view(-1), got[k][0, p], atol=1e-10), (
                k,
                p,
                (logits.view(-1) - got[k][0, p]).abs().max(),
            )


def test_the_same_seed_makes_the_same_set(fx: fixtures.Fixtures, tmp_path: Path) -> None:
    again = fixtures.generate(TOY, tmp_path, quiet=True)
    for name in ("target-trained", "draft-trained"):
        assert (again.path(name) / "model.safetensors").read_bytes() == (
            fx.path(name) / "model.safetensors"
        ).read_bytes()


def test_training_runs_deterministic_kernels_and_math_attention_and_reports_what_is_not() -> None:
    import torch

    from bench.models.trained import deterministic_training

    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cuda.flash_sdp_enabled())
    with deterministic_training(7) as nondeterministic:
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        enabled = {
            name: getattr(torch.backends.cuda, f"{name}_sdp_enabled")()
            for name in ("math", "flash", "mem_efficient", "cudnn")
        }
        assert enabled == {"math": True, "flash": False, "mem_efficient": False, "cudnn": False}, enabled
        first = torch.rand(3)
        for _ in range(2):  # no CPU kernel raises it: what SDPA's cuDNN backward raised on the H200, twice
            warnings.warn(CUDNN_ATTENTION_WARNING, stacklevel=1)
        warnings.warn("an unrelated warning", stacklevel=1)
    assert nondeterministic == [CUDNN_ATTENTION_WARNING]
    assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cuda.flash_sdp_enabled()) == before
    with deterministic_training(7):
        assert torch.equal(torch.rand(3), first), "seeded"


def test_the_manifest_says_no_kernel_ran_nondeterministically(fx: fixtures.Fixtures) -> None:
    assert _manifest(fx)["figures"]["nondeterministic"] == []


def test_parameters_that_cannot_work_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match="inside them"):
        fixtures.generate(dataclasses.replace(TOY, trained_layers=3), tmp_path, quiet=True)
    with pytest.raises(TrainingError, match="coincide"):
        fixtures.generate(dataclasses.replace(TOY, small_layers=6), tmp_path, quiet=True)
    assert not list(tmp_path.iterdir()), "nothing half-written is left behind"


def test_presets_and_pairs_for_the_benchmark() -> None:
    assert fixtures.PRESETS["trained"] is fixtures.PRESETS["trained-gpu-bound"]
    assert fixtures.default_pair("trained-gpu-bound") == "trained-gpu-bound"
    assert fixtures.default_pair("tiny") == "exact"


def test_cli_refuses_a_parameter_of_the_other_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench import cli

    assert cli.main(["fixtures", "--preset", "trained", "--root", str(tmp_path), "--layers", "4"]) == 2
    assert "preset trained has no parameter --layers" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before anything was built


def test_the_bench_sends_a_trained_sets_own_prompts_unless_told(
    fx: fixtures.Fixtures, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench.run import client
    from bench.run.arguments import parser

    monkeypatch.setattr(fixtures, "generate", lambda params, root=None, quiet=False: fx)  # the set, made once above
    own = run_settings.run_target(parser().parse_args(["--fixture-preset", "trained"]), tmp_path, tmp_path)
    assert fx.prompts_file() is not None and own.prompts_file == str(fx.prompts_file())
    assert list(own.prompts) == client.load_prompts(fx.prompts_file()) and len(set(own.prompts)) == TOY.prompt_count
    told = tmp_path / "mine.txt"
    told.write_text("first\nsecond\n")
    mine = run_settings.run_target(
        parser().parse_args(["--fixture-preset", "trained", "--prompts", str(told)]), tmp_path, tmp_path
    )
    assert (mine.prompts, mine.prompts_file) == (("first", "second"), str(told))


def test_a_newer_transformers_reuses_the_set_an_older_one_wrote(
    fx: fixtures.Fixtures, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, key = fx.root.parent.parent, fx.root.name
    assert fx.root.parent.name == fixtures.writer_tag()
    newer = f"transformers-{int(fixtures.writer_tag().split('-')[1]) + 1}"
    monkeypatch.setattr(fixtures, "writer_tag", lambda: newer)
    assert fixtures.generate(TOY, base, quiet=True).root == fx.root  # found, not trained again
    assert not (base / newer).exists()
    # never the other way: an older release cannot load what a newer one wrote
    older = f"transformers-{int(fx.root.parent.name.split('-')[1]) - 1}"
    assert fixtures._older_writers_set(base, older, key) is None
