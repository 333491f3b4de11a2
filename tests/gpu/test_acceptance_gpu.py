"""Acceptance after speculation comes back on, on the trained pair (the point of the draft sync).

Long requests live through an off period: one batch of BURST short requests and SURVIVORS long ones
(BURST + SURVIVORS > N) starts with speculation off; once the short ones finish, the survivors are
at most M and speculation comes back. Their verify steps from then on are compared with an
always-speculating server's on the same text: each survivor's prompt plus the tokens it decoded
before speculation came back, continued for the same number of tokens. They must accept at least
ACCEPT_FLOOR of the reference: v1 syncs its draft in every fallback step, v2 catches it up in the step
that turns speculation back on.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from bench import client
from bench.server import Server, ServerSpec

import gpu_harness as H
from gpu_harness import SUMMARY

pytestmark = [pytest.mark.gpu, pytest.mark.switch]
SURVIVORS = H.ENABLE
BURST = 3 * H.DISABLE
LONG, SHORT = 256, 48
ACCEPT_FLOOR = 0.95


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


def _generate(url: str, ids: list[list[int]], max_new: list[int]) -> list[dict[str, Any]]:
    """One batch request, so every request reaches the scheduler at once."""
    body: dict[str, Any] = {"input_ids": ids, "sampling_params": [{"temperature": 0.0, "max_new_tokens": m, "ignore_eos": True}
                                                  for m in max_new]}
    r = requests.post(url + "/generate", json=body, timeout=600)
    assert r.status_code == 200, f"HTTP {r.status_code}: {r.text[:500]}"
    out: list[dict[str, Any]] = r.json()
    return out


def _serve(name: str, spec: ServerSpec, ctx: dict[str, Any], ids: list[list[int]],
           max_new: list[int]) -> tuple[list[dict[str, Any]], Path]:
    log = H.fresh_log(ctx["logs"], name)
    with Server(spec, log, ctx["tree"]) as srv:
        return _generate(srv.url, ids, max_new), log


@pytest.fixture(scope="module")
def ctx(sgl_tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    from transformers import AutoTokenizer

    models = H.models_for("trained", fixture_models)
    tok = AutoTokenizer.from_pretrained(models.target)
    prompts = client.load_prompts()[: BURST + SURVIVORS]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    return {"tree": sgl_tree, "logs": log_dir, "models": models, "ids": ids}


def _survivors(ctx: dict[str, Any], worker: str) -> list[Survivor]:
    spec = H.switch_spec(ctx["models"], worker, H.tp_size())
    name = f"reenable-{worker}"
    out, log = _serve(name, spec, ctx, ctx["ids"], [SHORT] * BURST + [LONG] * SURVIVORS)
    log_lines = log.read_text(errors="replace").splitlines()
    events = [line for line in log_lines if "spec-switch: speculation" in line]
    assert any("OFF" in e for e in events) and any("ON" in e for e in events), (
        f"expected the switch to go off and back on ({log}): {events[:4]}")
    if worker == "v2":
        caught_up = [line for line in log_lines if "draft caught up over" in line]
        assert caught_up, f"{name}: speculation came back without the draft catch-up ({log})"
        SUMMARY.append(f"[{worker} trained] {caught_up[0].split('spec-switch: ')[-1]}")
    result = []
    for ids, r in zip(ctx["ids"][BURST:], out[BURST:], strict=True):
        meta = r["meta_info"]
        s = Survivor(ids, list(r["output_ids"]), int(meta.get("spec_verify_ct", 0)), H.accepted_drafts(meta))
        assert len(s.output_ids) == LONG and s.verify_steps > 0 and s.before > SHORT // 2, (
            f"{name}: a survivor did not live through an off period and speculate after it: {s.before} tokens "
            f"before, {s.verify_steps} verify steps ({log})")
        result.append(s)
    return result


def _reference(ctx: dict[str, Any], worker: str, survivors: list[Survivor]) -> list[tuple[int, int]]:
    """(verify steps, accepted drafts) of an always-speculating server on each survivor's continuation."""
    ids = [s.prompt_ids + s.output_ids[: s.before] for s in survivors]
    out, _ = _serve(f"reenable-{worker}-always-spec", H.always_spec(ctx["models"], worker, H.tp_size()), ctx, ids,
                    [s.spec_tokens for s in survivors])
    return [(int(r["meta_info"]["spec_verify_ct"]), H.accepted_drafts(r["meta_info"])) for r in out]


def _drafts_per_verify(pairs: list[tuple[int, int]]) -> float:
    return sum(a for _, a in pairs) / max(1, sum(v for v, _ in pairs))


def _measure(ctx: dict[str, Any], worker: str) -> tuple[float, float]:
    survivors = _survivors(ctx, worker)
    got = _drafts_per_verify([(s.verify_steps, s.accepted_drafts) for s in survivors])
    want = _drafts_per_verify(_reference(ctx, worker, survivors))
    off = sum(s.before for s in survivors) / len(survivors)
    SUMMARY.append(f"[{worker} trained] after re-enable: {got:.3f} accepted drafts per verify step "
                   f"(accept length {1 + got:.2f}) against {want:.3f} ({1 + want:.2f}) always speculating on the "
                   f"same text: ratio {got / want if want else float('nan'):.3f}; {SURVIVORS} survivors, "
                   f"{off:.0f} tokens each before speculation came back")
    return got, want


@pytest.mark.parametrize("worker", ["v1", "v2"])
def test_acceptance_recovers_after_reenable(ctx: dict[str, Any], worker: str) -> None:
    got, want = _measure(ctx, worker)
    assert want > 0, "the always-speculating reference accepted no draft token: the trained draft is broken"
    assert got >= ACCEPT_FLOOR * want, (f"{worker}: after re-enable the survivors accept {got:.3f} drafts per "
                                        f"verify, below {ACCEPT_FLOOR} x the reference's {want:.3f}")
