"""Acceptance after speculation comes back on, on the trained pair (the point of the draft sync).

The load is reenable.py's: long requests live through an off period and then speculate. They must
accept at least ACCEPT_FLOOR of an always-speculating server on the same text, over their first
verify steps (where a stale draft shows) and over all of them (their own counters): v1 syncs its
draft in every fallback step, v2 catches it up in the step that turns speculation back on. The
switching server serves from reenable.py's used pool, so a position the sync missed holds another
request's draft KV, as on a warm server.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import gpu_harness as H
import reenable as R
from gpu_harness import SUMMARY

pytestmark = [pytest.mark.gpu, pytest.mark.switch]


@dataclass(frozen=True)
class Survivor:
    prompt_ids: list[int]
    output_ids: list[int]
    verify_steps: int
    accepted_drafts: int

    @property
    def spec_tokens(self) -> int:
        """Tokens its verify steps produced: the accepted drafts plus one per step."""
        return self.verify_steps + self.accepted_drafts

    @property
    def before(self) -> int:
        """Tokens decoded before speculation came back (the prefill's and the fallback steps'), less
        the drafts its last verify step accepted past its last token: both workers count those
        (eagle_info.py counts the verify's row before cutting it at max_new_tokens, the v2 output
        processor the whole accept length)."""
        return len(self.output_ids) - self.spec_tokens


@pytest.fixture(scope="module")
def ctx(sgl_tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    return R.trained_context(sgl_tree, log_dir, fixture_models)


def _survivors(ctx: dict[str, Any], worker: str) -> tuple[list[Survivor], R.AfterBurst]:
    spec = H.switch_spec(ctx["models"], worker, H.tp_size())
    name = f"reenable-{worker}"
    out, log = R.serve(name, spec, ctx, ctx["ids"], R.burst_lengths(), used_pool=True)
    text = log.read_text(errors="replace")
    events = [line for line in text.splitlines() if "spec-switch: speculation" in line]
    assert any("OFF" in e for e in events) and any("ON" in e for e in events), (
        f"expected the switch to go off and back on ({log}): {events[:4]}"
    )
    if worker == "v2":
        caught_up = [line for line in text.splitlines() if R.CATCH_UP_LOG in line]
        assert caught_up, f"{name}: speculation came back without the draft catch-up ({log})"
        SUMMARY.append(f"[{worker} trained] {caught_up[0].split('spec-switch: ')[-1]}")
    seen = R.after_burst(text, log)
    result = []
    for ids, r in zip(ctx["ids"][R.BURST :], out[R.BURST :], strict=True):
        meta = r["meta_info"]
        s = Survivor(ids, list(r["output_ids"]), int(meta.get("spec_verify_ct", 0)), H.accepted_drafts(meta))
        assert len(s.output_ids) == R.LONG and s.verify_steps > 0 and s.before > R.SHORT // 2, (
            f"{name}: a survivor did not live through an off period and speculate after it: {s.before} tokens "
            f"before, {s.verify_steps} verify steps ({log})"
        )
        # The log counts exactly; the counters may be short by what the last verify drafted past the end.
        assert 0 <= seen.before - s.before <= H.num_steps(worker), (
            f"{name}: the log puts the first verify step after {seen.before} tokens, a survivor's own "
            f"counters after {s.before} ({log})"
        )
        result.append(s)
    return result, seen


def _measure(ctx: dict[str, Any], worker: str) -> tuple[R.Acceptance, R.Acceptance]:
    survivors, seen = _survivors(ctx, worker)
    tail = R.drafts_per_verify([(s.verify_steps, s.accepted_drafts) for s in survivors])
    got = R.Acceptance(seen.acceptance.early, tail)
    want = R.reference(
        ctx,
        f"reenable-{worker}-always-spec",
        H.always_spec(ctx["models"], worker, H.tp_size()),
        [(s.prompt_ids, s.output_ids, seen.before) for s in survivors],
    )
    SUMMARY.append(
        f"[{worker} trained] after re-enable ({R.SURVIVORS} survivors, {seen.before} tokens each before "
        f"speculation came back): {R.compared(got, want)}"
    )
    return got, want


@pytest.mark.parametrize("worker", ["v1", "v2"])
def test_acceptance_recovers_after_reenable(ctx: dict[str, Any], worker: str) -> None:
    got, want = _measure(ctx, worker)
    R.assert_draft_current(worker, got, want)
