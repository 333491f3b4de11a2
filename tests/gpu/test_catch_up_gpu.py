"""The v2 switch's draft catch-up on a real GPU (0006).

The ramp's levels send requests of one length, which finish together, so speculation may come
back with nobody left behind. Here REQUESTS requests of staggered lengths start at once, above N:
speculation goes off; as the short ones finish the batch falls to M with the long ones still
running, and the step that turns speculation back on must catch their draft up in one extend.
The outputs must equal a no-speculation server's (the exact pair has no near-ties). The
mlp-sync case adds --moe-dense-tp-size 1, which turns on MLP sync at TP 1 as an all-to-all MoE
backend does at TP 8: there the extend must carry its own token counts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.run import client

import gpu_harness as H
import greedy_compare as G
from gpu_harness import SUMMARY

pytestmark = [pytest.mark.gpu, pytest.mark.switch]
REQUESTS = 3 * H.DISABLE // 2
CATCH_UP = "spec-switch: draft caught up over"
VARIANTS = {"plain": [], "mlp-sync": ["--moe-dense-tp-size", "1"]}


@pytest.fixture(scope="module")
def ctx(sgl_tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    prompts = [f"Request {i}. {p}" for i, p in enumerate(client.load_prompts()[:REQUESTS])]
    lengths = {p: {"sampling_params": {**H.GREEDY, "max_new_tokens": 24 + 16 * i}} for i, p in enumerate(prompts)}
    return {
        "tree": sgl_tree,
        "logs": log_dir,
        "models": H.models_for("exact", fixture_models),
        "prompts": prompts,
        "lengths": lengths,
    }


def _serve(ctx: dict[str, Any], name: str, spec: Any) -> H.Run:
    return H.once(
        name,
        lambda: H.run_server(
            name, spec, ctx["tree"], ctx["logs"], [ctx["prompts"]], H.GREEDY, extra_by_prompt=ctx["lengths"]
        ),
    )


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_speculation_comes_back_with_the_draft_caught_up(ctx: dict[str, Any], variant: str) -> None:
    ref = _serve(ctx, "catch-up-nospec", H.nospec_spec(ctx["models"], H.tp_size()))
    spec = H.switch_spec(ctx["models"], "v2", H.tp_size(), extra=VARIANTS[variant])
    run = _serve(ctx, f"catch-up-v2-{variant}", spec)
    assert not run.errors and not ref.errors, f"requests failed: {(run.errors or ref.errors)[0]} ({run.log_path})"
    assert run.healthy_after, f"the server did not survive the run ({run.log_path})"
    caught_up = [line for line in run.log_text.splitlines() if CATCH_UP in line]
    SUMMARY.append(
        f"[v2 {variant}] {caught_up[0].split('spec-switch: ')[-1] if caught_up else 'no catch-up'}; "
        f"counters {run.counters()}"
    )
    assert caught_up, f"speculation came back without a catch-up ({run.log_path})"
    cmp = G.compare(run, ref)
    SUMMARY.append(f"[v2 {variant}] {cmp.line()}")
    assert cmp.equal == cmp.total == REQUESTS, f"outputs differ from no-speculation greedy ones: {cmp.divergences[:2]}"
