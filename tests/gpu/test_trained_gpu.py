"""The trained set on the GPU: its generator is deterministic there, and the GPU-bound twin's
pass-through layers leave the small target's outputs as they are, so measurements on either describe
the same model (the reference servers of both, at a concurrency of 64)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.models import fixtures
from bench.models.trained_params import TrainedParams

import gpu_harness as H
import greedy_compare as G
from gpu_harness import SUMMARY

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ctx(sgl_tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    return H.ramp_context(sgl_tree, log_dir, fixture_models)


# Small enough for seconds, with 128-wide heads in bf16: the shape for which SDPA picks cuDNN's
# attention, whose backward made two generations of one key differ (generator version 4).
SMALL_ON_GPU = TrainedParams(
    hidden=512,
    heads=4,
    kv_heads=2,
    intermediate=1024,
    draft_intermediate=512,
    vocab=300,
    corpus_bytes=300_000,
    seq_len=256,
    batch=8,
    target_steps=20,
    draft_steps=20,
    gpu_bound_layers=0,
    prompt_count=8,
    prompt_candidates=16,
    prompt_new_tokens=8,
)


def test_the_generator_is_deterministic_on_the_gpu(tmp_path: Path) -> None:
    first, second = (fixtures.generate(SMALL_ON_GPU, tmp_path / name, quiet=True) for name in ("a", "b"))
    manifest = json.loads((first.root / "manifest.json").read_text(encoding="utf-8"))
    SUMMARY.append(
        f"[trained generator on the GPU] nondeterministic kernels: {manifest['figures']['nondeterministic']}"
    )
    for name in ("target-trained", "draft-trained"):
        a, b = ((s.path(name) / "model.safetensors").read_bytes() for s in (first, second))
        assert a == b, f"{name}: two generations from one seed differ"


def test_gpu_bound_twin_gives_the_small_targets_outputs(ctx: dict[str, Any]) -> None:
    small, deep = H.ref_run(ctx, "trained"), H.ref_run(ctx, "trained-gpu-bound")
    assert not small.errors and not deep.errors, (small.errors or deep.errors)[0]
    cmp = G.compare(deep, small)
    SUMMARY.append(f"[trained-gpu-bound vs trained, no speculation] {cmp.line()}")
    # Bit-equal by construction; a request whose batch neighbours differ may still flip a near-tie.
    assert cmp.rate >= 0.99 and not cmp.not_near_tie, f"the 32-layer twin's outputs differ: {cmp.divergences[:3]}"
