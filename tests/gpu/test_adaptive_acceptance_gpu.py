"""Acceptance after a high-load period under upstream's --speculative-adaptive (SGLang 0.5.11+; the
skip case 0.5.14+), for the comparison with our switch on the lines that have it.

reenable.py's load on a server whose tier file speculates 3 steps up to a batch of DISABLE and none
above: upstream's way to say "off above N". Upstream counts a steps=0 step as a verify step of each
request in it, so a request's own counters cannot tell the kinds apart; the decode log can: with
--decode-log-interval 1 each line covers one step, with that step's accept length, and once the
burst has finished the batch holds SURVIVORS or fewer, so every step is a 3-step one. With the
draft extend that upstream runs in a steps=0 step, the survivors must accept ACCEPT_FLOOR of an
always-speculating server on the same text, in both of reenable.py's windows; with
SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1 the draft falls behind while off and the survivors must
accept less than that floor in the first verify steps: else the test cannot tell a stale draft
from a kept one. On the release lines a steps=0
step is a plain decode by default (their 0002), so the upstream cases set
SGLANG_SPEC_ZERO_STEP_PLAIN_DECODE=0; in the plain case the draft gets nothing while off and is caught
up in one extend when speculation comes back (the lines' deferred catch-up), so the same floor holds.
Every case serves from reenable.py's used pool: the stale span then holds other requests' draft KV,
as on a warm server.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from bench.configs import SKIP_ZERO_STEP_DRAFT_EXTEND, ZERO_STEP_PLAIN_DECODE, write_off_above_tiers
from bench.run.server import ServerSpec, missing_environ, missing_server_args

import gpu_harness as H
import reenable as R
from gpu_harness import SUMMARY

pytestmark = pytest.mark.gpu
STEPS = H.V2_STEPS
# Upstream's steps=0 on a line's tree, where the plain decode is the default (ignored upstream).
UPSTREAM_STEPS0 = {ZERO_STEP_PLAIN_DECODE: "0"}
CASES = {
    "kept": UPSTREAM_STEPS0,
    "skip": {**UPSTREAM_STEPS0, SKIP_ZERO_STEP_DRAFT_EXTEND: "1"},
    # the lines' plain decode: no draft work while off, the draft caught up at re-enable
    "plain": {ZERO_STEP_PLAIN_DECODE: "1"},
}
DRAFT_KEPT = ("kept", "plain")


@pytest.fixture(scope="module")
def ctx(sgl_tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    if missing_server_args(sgl_tree, ["speculative_adaptive", "speculative_adaptive_config"]):
        pytest.skip(f"the SGLang in {sgl_tree} has no --speculative-adaptive (0.5.11+)")
    return R.trained_context(sgl_tree, log_dir, fixture_models)


def adaptive_spec(ctx: dict[str, Any], env: dict[str, str]) -> ServerSpec:
    """The always-speculating v2 server, with upstream's adaptive mode and the "off above N" tiers."""
    tiers = write_off_above_tiers(ctx["logs"] / "reenable-adaptive-tiers.json", H.DISABLE, STEPS)
    spec = H.always_spec(
        ctx["models"], "v2", H.tp_size(), extra=["--speculative-adaptive", "--speculative-adaptive-config", str(tiers)]
    )
    return dataclasses.replace(spec, env={**spec.env, **env})


@pytest.mark.parametrize("case", list(CASES))
def test_acceptance_after_a_high_load_period(ctx: dict[str, Any], case: str) -> None:
    env = CASES[case]
    # A variable set to 0 only turns a line's default off: upstream runs without reading it.
    if missing_environ(ctx["tree"], [name for name, value in env.items() if value != "0"]):
        pytest.skip(
            f"the SGLang in {ctx['tree']} does not read {', '.join(env)} (skip: 0.5.14+; plain: "
            "this series' v0.5.15 line)"
        )
    name = f"reenable-adaptive-{case}"
    out, log = R.serve(name, adaptive_spec(ctx, env), ctx, ctx["ids"], R.burst_lengths(), used_pool=True)
    text = log.read_text(errors="replace")
    switches = H.adaptive_state_switches(text)
    assert any("-> 0" in s for s in switches) and any(f"-> {STEPS}" in s for s in switches), (
        f"{name}: expected the tiers to turn speculation off and back on ({log}): {switches[:4]}"
    )
    survivors = out[R.BURST :]
    assert all(len(r["output_ids"]) == R.LONG for r in survivors), f"{name}: a survivor stopped early ({log})"
    seen = R.after_burst(text, log)
    want = R.reference(
        ctx,
        f"{name}-always-spec",
        H.always_spec(ctx["models"], "v2", H.tp_size()),
        [(ids, list(r["output_ids"]), seen.before) for ids, r in zip(ctx["ids"][R.BURST :], survivors, strict=True)],
    )
    SUMMARY.append(
        f"[adaptive {case} trained] after the burst ({seen.steps} verify steps, {seen.before} tokens each "
        f"before, state switches {len(switches)}): {R.compared(seen.acceptance, want)}"
    )
    if case in DRAFT_KEPT:
        R.assert_draft_current(f"{case}: steps=0 with the draft kept or caught up", seen.acceptance, want)
    else:
        early = seen.acceptance.ratio(want).early
        assert early < R.ACCEPT_FLOOR, (
            f"{case}: the draft went {seen.before} tokens a request without an extend, yet its first "
            f"{R.EARLY_STEPS} verify steps accepted {early:.3f} of always speculating: the test cannot "
            "tell a stale draft from a caught-up one, so the other cases' floor proves nothing"
        )
