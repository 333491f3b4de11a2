"""Upstream's --speculative-adaptive with its default tiers (no tier file: candidate steps up to 7,
beyond the harness's 3 active steps) on a GPU: the server starts with CUDA graphs, serves the ramp
while the tiers move between step counts, and its greedy outputs equal a plain server's on the
trained pair. Unpatched 0.5.15 dies at start-up capturing the steps=7 state ("shared logits buffer
holds 1024 rows but caller needs 2048"); the v0.5.15 line's 0003 sizes that buffer for every state.

Skipped on a tree without --speculative-adaptive (the v0.5.9 line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.run.server import missing_server_args

import gpu_harness as H
import greedy_compare as G
from gpu_harness import SUMMARY

pytestmark = pytest.mark.gpu
PAIR = "trained"


@pytest.fixture(scope="module")
def ctx(sgl_tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    if missing_server_args(sgl_tree, ["speculative_adaptive"]):
        pytest.skip(f"the SGLang in {sgl_tree} has no --speculative-adaptive (0.5.11+)")
    return H.ramp_context(sgl_tree, log_dir, fixture_models)


def default_tiers_run(ctx: dict[str, Any]) -> H.Run:
    name = f"adaptive-default-v2-{PAIR}"
    spec = H.always_spec(
        H.models_for(PAIR, ctx["fx"]), "v2", H.tp_size(), extra=["--speculative-adaptive", *H.pair_flags(PAIR)]
    )
    return H.once(name, lambda: H.run_server(name, spec, ctx["tree"], ctx["logs"], H.groups_for(ctx, PAIR), H.GREEDY))


def test_starts_and_serves_the_ramp(ctx: dict[str, Any]) -> None:
    run = default_tiers_run(ctx)
    switches = H.adaptive_state_switches(run.log_text)
    SUMMARY.append(
        f"[adaptive default tiers {PAIR}] {len(run.results)} requests, {len(run.errors)} errors; "
        f"state switches {len(switches)}: {switches[:6]}; log {run.log_path}"
    )
    assert not run.errors, f"{len(run.errors)} request(s) failed, first: {run.errors[0]}\nlog: {run.log_path}"


def test_greedy_outputs_equal_a_plain_server(ctx: dict[str, Any]) -> None:
    cmp = G.compare(default_tiers_run(ctx), H.ref_run(ctx, PAIR))
    SUMMARY.append(f"[adaptive default tiers {PAIR}] {cmp.line()}")
    assert not cmp.not_near_tie, f"greedy outputs diverge where the target is not near a tie: {cmp.not_near_tie[0]}"
