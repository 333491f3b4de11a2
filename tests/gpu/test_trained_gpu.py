"""The trained set's GPU-bound twin: its pass-through layers must leave the small target's outputs as
they are, so measurements on either describe the same model (the reference servers of both, at a
concurrency of 64)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import gpu_harness as H
from gpu_harness import SUMMARY

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ctx(sgl_tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    return H.ramp_context(sgl_tree, log_dir, fixture_models)


def test_gpu_bound_twin_gives_the_small_targets_outputs(ctx: dict[str, Any]) -> None:
    small, deep = H.ref_run(ctx, "trained"), H.ref_run(ctx, "trained-gpu-bound")
    assert not small.errors and not deep.errors, (small.errors or deep.errors)[0]
    cmp = H.compare(deep, small)
    SUMMARY.append(f"[trained-gpu-bound vs trained, no speculation] {cmp.line()}")
    # Bit-equal by construction; a request whose batch neighbours differ may still flip a near-tie.
    assert cmp.rate >= 0.99 and not cmp.not_near_tie, f"the 32-layer twin's outputs differ: {cmp.divergences[:3]}"
