"""The fixture generator on CPU (no GPU needed; runs in CI): files, shapes, draft weight names,
the exact pair's construction, determinism and the cache."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
from pathlib import Path
from typing import Any

import pytest
from bench_helpers import DRAFT_NAMES

from bench import cli
from bench.models import fixtures
from bench.run import arguments

SMALL = fixtures.FixtureParams(hidden=64, layers=8, heads=4, kv_heads=2, intermediate=128, vocab=512, max_positions=512)


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> fixtures.Fixtures:
    return fixtures.generate(SMALL, tmp_path_factory.mktemp("fx"), quiet=True)


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def test_layout(fx: fixtures.Fixtures) -> None:
    for name in ("target-exact", "target-random", "draft-exact", "draft-random"):
        d = fx.path(name)
        for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            assert (d / f).is_file(), f"{name}/{f} missing"
        assert list(d.glob("*.safetensors")), f"{name} has no weights"
    manifest = json.loads((fx.root / "manifest.json").read_text())
    assert manifest["key"] == SMALL.key() == fx.root.name
    assert fx.pair("exact") == (fx.path("target-exact"), fx.path("draft-exact"))


def test_draft_checkpoint(fx: fixtures.Fixtures) -> None:
    import torch
    from safetensors.torch import load_file

    vocab = json.loads((fx.root / "manifest.json").read_text())["vocab"]
    h = SMALL.hidden
    for kind in ("exact", "random"):
        d = fx.path(f"draft-{kind}")
        cfg = json.loads((d / "config.json").read_text())
        assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
        assert cfg["num_hidden_layers"] == 1 and cfg["hidden_size"] == h
        assert cfg["vocab_size"] == cfg["draft_vocab_size"] == vocab
        w = load_file(str(d / "model.safetensors"))
        assert set(w) == DRAFT_NAMES
        assert w["fc.weight"].shape == (h, 3 * h)
        assert w["midlayer.self_attn.q_proj.weight"].shape == (SMALL.heads * (h // SMALL.heads), 2 * h)
        assert w["midlayer.self_attn.k_proj.weight"].shape == (SMALL.kv_heads * (h // SMALL.heads), 2 * h)
        assert w["lm_head.weight"].shape == (vocab, h)
        assert w["d2t"].dtype == torch.int64 and not w["d2t"].any()
        assert w["t2d"].dtype == torch.bool and w["t2d"].all()
        assert w["fc.weight"].dtype == torch.bfloat16
    ex = load_file(str(fx.path("draft-exact") / "model.safetensors"))
    fc = ex["fc.weight"].float()
    assert not fc[:, : 2 * h].any(), "exact draft: fc must be [0 | 0 | I]"
    assert torch.equal(fc[:, 2 * h :], torch.eye(h))
    assert not ex["midlayer.self_attn.o_proj.weight"].any() and not ex["midlayer.mlp.down_proj.weight"].any()
    rnd = load_file(str(fx.path("draft-random") / "model.safetensors"))
    assert rnd["fc.weight"].float().std() > 0


def test_exact_target_repeats_last_token_and_draft_agrees(fx: fixtures.Fixtures) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, LlamaForCausalLM

    target = LlamaForCausalLM.from_pretrained(str(fx.path("target-exact")), torch_dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(fx.path("target-exact")))
    assert target.config.num_hidden_layers == SMALL.layers and target.config.vocab_size == len(tok)
    assert torch.equal(target.lm_head.weight, target.model.embed_tokens.weight)
    ids = tok("def fix the bug in the server", return_tensors="pt").input_ids
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    pred = out.logits[0].argmax(-1)
    assert torch.equal(pred, ids[0]), "the exact target must predict the token it was fed"
    # the draft's view: fc([h_a | h_b | h_c]) = h_c = the token's embedding; lm_head = embed -> same token
    d = load_file(str(fx.path("draft-exact") / "model.safetensors"))
    aux = torch.cat([out.hidden_states[i] for i in (2, SMALL.layers // 2, SMALL.layers - 3)], dim=-1)[0]
    hidden = aux @ d["fc.weight"].float().T
    normed = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + 1e-5)
    draft_pred = (normed @ d["lm_head.weight"].float().T).argmax(-1)
    assert torch.equal(draft_pred, ids[0])
    rand = LlamaForCausalLM.from_pretrained(str(fx.path("target-random")), torch_dtype=torch.float32)
    with torch.no_grad():
        assert not torch.equal(rand(ids).logits[0].argmax(-1), ids[0])


def test_deterministic_and_cached(fx: fixtures.Fixtures, tmp_path: Path) -> None:
    again = fixtures.generate(SMALL, fx.root.parents[1], quiet=True)
    assert again.root == fx.root  # cache hit: nothing rebuilt
    fresh = fixtures.generate(SMALL, tmp_path, quiet=True)
    assert _digest(fresh.root) == _digest(fx.root), "same parameters must give byte-identical fixtures"
    other = fixtures.FixtureParams(**{**SMALL.__dict__, "seed": SMALL.seed + 1})
    assert other.key() != SMALL.key()


def test_sets_are_cached_per_transformers_major(fx: fixtures.Fixtures, monkeypatch: pytest.MonkeyPatch) -> None:
    """A set 4.x wrote is not served to 5.x (nor the other way): one machine runs lines of both."""
    import transformers

    assert fx.root.parent.name == "transformers-" + transformers.__version__.split(".")[0]
    installed = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "99.1.0" if name == "transformers" else installed(name)
    )
    other = fixtures.generate(SMALL, fx.root.parents[1], quiet=True)
    assert other.root != fx.root and other.root.parent.name == "transformers-99"
    assert other.root.name == fx.root.name == SMALL.key()


def test_cli_prints_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--root",
        str(tmp_path),
        "--hidden",
        "64",
        "--layers",
        "8",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--intermediate",
        "128",
        "--vocab",
        "512",
        "--max-positions",
        "512",
        "--json",
    ]
    assert cli.main(["fixtures", *argv]) == 0
    paths = json.loads(capsys.readouterr().out)
    assert Path(paths["exact"]["target"]).is_dir() and Path(paths["random"]["draft"]).is_dir()
    # the CLI's parameters are the tiny preset's: same folder as generate() with those values
    assert Path(paths["exact"]["target"]).parent.name == SMALL.key()


def test_exact_only_set_has_the_same_exact_pair(fx: fixtures.Fixtures, tmp_path: Path) -> None:
    import dataclasses

    only = fixtures.generate(dataclasses.replace(SMALL, random_pair=False), tmp_path, quiet=True)
    assert sorted(p.name for p in only.root.iterdir() if p.is_dir()) == ["draft-exact", "target-exact", "tokenizer"]
    for name in ("target-exact", "draft-exact"):
        assert _digest(only.path(name)) == _digest(fx.path(name)), name
    with pytest.raises(fixtures.FixtureError, match="no random pair"):
        only.pair("random")


def _shrunk_gpu_bound(root: Path) -> list[str]:
    """`bench fixtures` arguments for the gpu-bound preset with every size shrunk to a toy's."""
    sizes = {
        "hidden": 64,
        "layers": 2,
        "heads": 4,
        "kv-heads": 2,
        "intermediate": 128,
        "vocab": 512,
        "max-positions": 512,
    }
    return [
        "--root",
        str(root),
        "--preset",
        "gpu-bound",
        *(arg for name, n in sizes.items() for arg in (f"--{name}", str(n))),
    ]


def test_gpu_bound_preset_from_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    preset = fixtures.PRESETS["gpu-bound"]
    assert isinstance(preset, fixtures.FixtureParams)
    assert preset.hidden % preset.heads == 0 and preset.heads % preset.kv_heads == 0
    assert preset.device == "cuda" and not preset.random_pair
    # The preset's other fields, shrunk and drawn on CPU here: only the exact pair is written.
    argv = [*_shrunk_gpu_bound(tmp_path), "--device", "cpu", "--json"]
    assert cli.main(["fixtures", *argv]) == 0
    assert list(json.loads(capsys.readouterr().out)) == ["exact"]


def test_deep_preset_only_doubles_the_target_depth() -> None:
    # The draft is one layer whatever the target; the deep preset is there to halve its share.
    base, deep = fixtures.PRESETS["gpu-bound"], fixtures.PRESETS["gpu-bound-deep"]
    assert isinstance(base, fixtures.FixtureParams) and isinstance(deep, fixtures.FixtureParams)
    assert deep.layers == 2 * base.layers and dataclasses.replace(deep, layers=base.layers) == base
    assert deep.key() != base.key()


def test_bench_offers_every_fixture_preset() -> None:
    for name in fixtures.PRESETS:
        assert arguments.parse(["--fixture-preset", name]).fixture_preset == name


def test_unavailable_device_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    argv = _shrunk_gpu_bound(tmp_path)
    assert cli.main(["fixtures", *argv]) == 1
    assert "fixture device 'cuda' is not available here" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_a_set_finished_meanwhile_by_another_process_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sweeps generating the same set at once: the later one must not pull the first one's
    files from under its running server."""
    import dataclasses

    params = dataclasses.replace(SMALL, random_pair=False)
    real_build_draft = fixtures.build_draft
    other: list[tuple[fixtures.Fixtures, int]] = []

    def build_draft_while_another_finishes(*args: Any, **kwargs: Any) -> None:
        if not other:
            monkeypatch.setattr(fixtures, "build_draft", real_build_draft)
            done = fixtures.generate(params, tmp_path, quiet=True)
            other.append((done, (done.root / "target-exact" / "model.safetensors").stat().st_ino))
        real_build_draft(*args, **kwargs)

    monkeypatch.setattr(fixtures, "build_draft", build_draft_while_another_finishes)
    mine = fixtures.generate(params, tmp_path, quiet=True)
    ((first, first_inode),) = other
    assert mine.root == first.root
    assert (mine.root / "target-exact" / "model.safetensors").stat().st_ino == first_inode
    assert [p.name for p in (tmp_path / fixtures.writer_tag()).iterdir()] == [params.key()]  # no temp folder left
