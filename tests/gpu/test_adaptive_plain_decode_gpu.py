"""The release lines' plain-decode patch on a GPU: upstream's --speculative-adaptive with the "off
above N" tier file and SGLANG_SPEC_ZERO_STEP_PLAIN_DECODE=1 (the lines' default, set so that the
test says what it runs) serves the ramp, its steps=0 batches replay the DECODE graphs the patch
captures for that state, and its greedy outputs equal a plain server's (the trained pair, where a
divergence away from a near-tie is a bug). The ramp's levels end on one step, so speculation
comes back with nobody behind (GPU 19: two state switches, no catch-up); where the line has the
deferred catch-up, staggered.py's load has requests outlive the off period, and their outputs
after the catch-up (an extend that rewrites target KV) equal a plain server's on the exact pair.

Skipped on a tree whose SGLang does not read the variable (upstream, and the v0.5.9 line).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from bench.configs import ZERO_STEP_PLAIN_DECODE, write_off_above_tiers
from bench.run.server import missing_environ

import gpu_harness as H
import greedy_compare as G
import staggered as S
from gpu_harness import SUMMARY

pytestmark = pytest.mark.gpu
STEPS = H.V2_STEPS
PAIR = "trained"
# The lines' deferred catch-up (adaptive_draft_catch_up.py) logs each catch-up step.
CATCH_UP = "Adaptive spec: draft caught up over"
CATCH_UP_MODULE = "python/sglang/srt/speculative/adaptive_draft_catch_up.py"


def _plain_decode_tree(sgl_tree: Path) -> None:
    if missing_environ(sgl_tree, [ZERO_STEP_PLAIN_DECODE]):
        pytest.skip(f"the SGLang in {sgl_tree} does not read {ZERO_STEP_PLAIN_DECODE} (the v0.5.15 line's patch)")


@pytest.fixture(scope="module")
def ctx(sgl_tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    _plain_decode_tree(sgl_tree)
    return H.ramp_context(sgl_tree, log_dir, fixture_models)


def plain_decode_spec(logs: Path, name: str, models: H.Models, pair: str) -> H.ServerSpec:
    """The adaptive v2 server, off above H.DISABLE, with steps=0 batches as plain decodes."""
    tiers = write_off_above_tiers(logs / f"{name}-tiers.json", H.DISABLE, STEPS)
    spec = H.always_spec(
        models,
        "v2",
        H.tp_size(),
        extra=["--speculative-adaptive", "--speculative-adaptive-config", str(tiers), *H.pair_flags(pair)],
    )
    return dataclasses.replace(spec, env={**spec.env, ZERO_STEP_PLAIN_DECODE: "1"})


def plain_decode_run(ctx: dict[str, Any]) -> H.Run:
    """The plain-decode adaptive server on the ramp."""
    name = f"adaptive-plain-v2-{PAIR}"
    spec = plain_decode_spec(ctx["logs"], name, H.models_for(PAIR, ctx["fx"]), PAIR)
    return H.once(name, lambda: H.run_server(name, spec, ctx["tree"], ctx["logs"], H.groups_for(ctx, PAIR), H.GREEDY))


def test_serves_the_ramp_off_above_n_on_decode_graphs(ctx: dict[str, Any]) -> None:
    run = plain_decode_run(ctx)
    switches = H.adaptive_state_switches(run.log_text)
    in_range, eager = H.fallback_graph_replays(run)
    caught_up = [line for line in run.log_text.splitlines() if CATCH_UP in line]
    SUMMARY.append(
        f"[adaptive plain-decode {PAIR}] {len(run.results)} requests, {len(run.errors)} errors; "
        f"{len(in_range)} decode log lines above a batch of {H.DISABLE + 1} with a graph size, "
        f"{len(eager)} of them eager; state switches {len(switches)}; {len(caught_up)} catch-ups; log {run.log_path}"
    )
    assert not run.errors, f"{len(run.errors)} request(s) failed, first: {run.errors[0]}\nlog: {run.log_path}"
    assert any("-> 0" in s for s in switches) and any(f"-> {STEPS}" in s for s in switches), (
        f"expected the tiers to turn speculation off and back on ({run.log_path}): {switches[:4]}"
    )
    assert in_range, f"no decode log line at a batch above {H.DISABLE + 1} with a graph size ({run.log_path})"
    assert not eager, (
        f"{len(eager)} steps=0 decode lines ran eagerly, first at a batch of {eager[0].batch_size}: "
        f"the steps=0 state's DECODE graphs were not replayed ({run.log_path})"
    )


def test_greedy_outputs_equal_a_plain_server(ctx: dict[str, Any]) -> None:
    cmp = G.compare(plain_decode_run(ctx), H.ref_run(ctx, PAIR))
    SUMMARY.append(f"[adaptive plain-decode {PAIR}] {cmp.line()}")
    assert not cmp.not_near_tie, f"greedy outputs diverge where the target is not near a tie: {cmp.not_near_tie[0]}"


@pytest.fixture(scope="module")
def staggered_ctx(sgl_tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    _plain_decode_tree(sgl_tree)
    if not (sgl_tree / CATCH_UP_MODULE).is_file():
        pytest.skip(f"the SGLang in {sgl_tree} has no deferred catch-up ({CATCH_UP_MODULE})")
    return S.context(sgl_tree, log_dir, fixture_models)


def test_speculation_comes_back_with_the_draft_caught_up(staggered_ctx: dict[str, Any]) -> None:
    name = "catch-up-adaptive-plain-v2"
    spec = plain_decode_spec(staggered_ctx["logs"], name, staggered_ctx["models"], "exact")
    run = S.serve(staggered_ctx, name, spec)
    S.assert_caught_up_exactly(staggered_ctx, run, CATCH_UP, "adaptive plain-decode exact")
