"""The v2 switch's draft catch-up on a real GPU (0006), on staggered.py's load: speculation goes
off above N, comes back at M with the long requests still running, and the step that turns it on
catches their draft up in one extend; the outputs equal a no-speculation server's. The mlp-sync
case adds --moe-dense-tp-size 1, which turns on MLP sync at TP 1 as an all-to-all MoE backend
does at TP 8: there the extend must carry its own token counts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import gpu_harness as H
import staggered as S

pytestmark = [pytest.mark.gpu, pytest.mark.switch]
CATCH_UP = "spec-switch: draft caught up over"
VARIANTS = {"plain": [], "mlp-sync": ["--moe-dense-tp-size", "1"]}


@pytest.fixture(scope="module")
def ctx(sgl_tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    return S.context(sgl_tree, log_dir, fixture_models)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_speculation_comes_back_with_the_draft_caught_up(ctx: dict[str, Any], variant: str) -> None:
    spec = H.switch_spec(ctx["models"], "v2", H.tp_size(), extra=VARIANTS[variant])
    run = S.serve(ctx, f"catch-up-v2-{variant}", spec)
    S.assert_caught_up_exactly(ctx, run, CATCH_UP, f"v2 {variant}")
