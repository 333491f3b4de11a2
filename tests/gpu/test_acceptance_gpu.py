"""Acceptance after speculation comes back on, on the trained pair (the point of the draft sync).

The load is reenable.py's: long requests live through an off period and then speculate. They must
accept at least ACCEPT_FLOOR of an always-speculating server on the same text: v1 syncs its draft
in every fallback step, v2 catches it up in the step that turns speculation back on. The switching
server serves from reenable.py's used pool, so a position the sync missed holds another request's
draft KV, not a fresh pool's zeros, which the trained draft barely notices.
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
        """Tokens decoded before speculation came back (the prefill's and the fallback steps')."""
        return len(self.output_ids) - self.spec_tokens


@pytest.fixture(scope="module")
def ctx(sgl_tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    return R.trained_context(sgl_tree, log_dir, fixture_models)


def _survivors(ctx: dict[str, Any], worker: str) -> list[Survivor]:
    spec = H.switch_spec(ctx["models"], worker, H.tp_size())
    name = f"reenable-{worker}"
    out, log = R.serve(name, spec, ctx, ctx["ids"], R.burst_lengths(), used_pool=True)
    log_lines = log.read_text(errors="replace").splitlines()
    events = [line for line in log_lines if "spec-switch: speculation" in line]
    assert any("OFF" in e for e in events) and any("ON" in e for e in events), (
        f"expected the switch to go off and back on ({log}): {events[:4]}"
    )
    if worker == "v2":
        caught_up = [line for line in log_lines if "draft caught up over" in line]
        assert caught_up, f"{name}: speculation came back without the draft catch-up ({log})"
        SUMMARY.append(f"[{worker} trained] {caught_up[0].split('spec-switch: ')[-1]}")
    result = []
    for ids, r in zip(ctx["ids"][R.BURST :], out[R.BURST :], strict=True):
        meta = r["meta_info"]
        s = Survivor(ids, list(r["output_ids"]), int(meta.get("spec_verify_ct", 0)), H.accepted_drafts(meta))
        assert len(s.output_ids) == R.LONG and s.verify_steps > 0 and s.before > R.SHORT // 2, (
            f"{name}: a survivor did not live through an off period and speculate after it: {s.before} tokens "
            f"before, {s.verify_steps} verify steps ({log})"
        )
        result.append(s)
    return result


def _measure(ctx: dict[str, Any], worker: str) -> tuple[float, float]:
    survivors = _survivors(ctx, worker)
    got = R.drafts_per_verify([(s.verify_steps, s.accepted_drafts) for s in survivors])
    want = R.reference(
        ctx,
        f"reenable-{worker}-always-spec",
        H.always_spec(ctx["models"], worker, H.tp_size()),
        [s.prompt_ids + s.output_ids[: s.before] for s in survivors],
        [s.spec_tokens for s in survivors],
    )
    off = sum(s.before for s in survivors) / len(survivors)
    SUMMARY.append(
        f"[{worker} trained] after re-enable: {got:.3f} accepted drafts per verify step "
        f"(accept length {1 + got:.2f}) against {want:.3f} ({1 + want:.2f}) always speculating on the "
        f"same text: ratio {got / want if want else float('nan'):.3f}; {R.SURVIVORS} survivors, "
        f"{off:.0f} tokens each before speculation came back"
    )
    return got, want


@pytest.mark.parametrize("worker", ["v1", "v2"])
def test_acceptance_recovers_after_reenable(ctx: dict[str, Any], worker: str) -> None:
    got, want = _measure(ctx, worker)
    assert want > 0, "the always-speculating reference accepted no draft token: the trained draft is broken"
    assert got >= R.ACCEPT_FLOOR * want, (
        f"{worker}: after re-enable the survivors accept {got:.3f} drafts per "
        f"verify, below {R.ACCEPT_FLOOR} x the reference's {want:.3f}"
    )
