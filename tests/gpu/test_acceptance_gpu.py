"""Acceptance after speculation comes back on, on the trained pair (the point of the draft sync).

Long requests live through an off period: one batch of BURST short requests and SURVIVORS long ones
(BURST + SURVIVORS > N) starts with speculation off; once the short ones finish, the survivors are
at most M and speculation comes back. Their verify steps from then on are compared with an
always-speculating server's on the same text: each survivor's prompt plus the tokens it decoded
before speculation came back, continued for the same number of tokens. With the draft kept in sync
they must accept at least ACCEPT_FLOOR of the reference, and so must v2 with the sync deferred to the
step that turns speculation back on (--speculative-fallback-deferred-draft-sync); with
--speculative-fallback-skip-draft-sync the loss is measured and reported (the reason that flag is not
the default).
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
# How each worker's fallback keeps its draft: the flags of each way, by name.
SYNC_KINDS: dict[str, dict[str, list[str]]] = {
    "v1": {"sync": [], "skip-sync": ["--speculative-fallback-skip-draft-sync"]},
    "v2": {"sync": [], "skip-sync": ["--speculative-fallback-skip-draft-sync"],
           "deferred": ["--speculative-fallback-deferred-draft-sync"]},
}


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


def _survivors(ctx: dict[str, Any], worker: str, kind: str) -> list[Survivor]:
    spec = H.switch_spec(ctx["models"], worker, H.tp_size(), extra=SYNC_KINDS[worker][kind])
    name = f"reenable-{worker}{'' if kind == 'sync' else '-' + kind}"
    out, log = _serve(name, spec, ctx, ctx["ids"], [SHORT] * BURST + [LONG] * SURVIVORS)
    events = [line for line in log.read_text(errors="replace").splitlines() if "spec-switch: speculation" in line]
    assert any("OFF" in e for e in events) and any("ON" in e for e in events), (
        f"expected the switch to go off and back on ({log}): {events[:4]}")
    if kind == "deferred":
        caught_up = [line for line in log.read_text(errors="replace").splitlines() if "draft caught up over" in line]
        assert caught_up, f"{name}: speculation came back without the deferred draft catch-up ({log})"
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


def _reference(ctx: dict[str, Any], worker: str, runs: list[list[Survivor]]) -> list[list[tuple[int, int]]]:
    """(verify steps, accepted drafts) of an always-speculating server on each survivor's continuation."""
    flat = [s for run in runs for s in run]
    ids = [s.prompt_ids + s.output_ids[: s.before] for s in flat]
    out, _ = _serve(f"reenable-{worker}-always-spec", H.always_spec(ctx["models"], worker, H.tp_size()), ctx, ids,
                    [s.spec_tokens for s in flat])
    pairs = [(int(r["meta_info"]["spec_verify_ct"]), H.accepted_drafts(r["meta_info"])) for r in out]
    return [pairs[i * SURVIVORS : (i + 1) * SURVIVORS] for i in range(len(runs))]


def _drafts_per_verify(pairs: list[tuple[int, int]]) -> float:
    return sum(a for _, a in pairs) / max(1, sum(v for v, _ in pairs))


def _measure(ctx: dict[str, Any], worker: str) -> dict[str, tuple[float, float]]:
    runs = {kind: _survivors(ctx, worker, kind) for kind in SYNC_KINDS[worker]}
    refs = _reference(ctx, worker, list(runs.values()))
    out = {}
    for (kind, survivors), ref in zip(runs.items(), refs, strict=True):
        got = _drafts_per_verify([(s.verify_steps, s.accepted_drafts) for s in survivors])
        want = _drafts_per_verify(ref)
        out[kind] = (got, want)
        off = sum(s.before for s in survivors) / len(survivors)
        SUMMARY.append(f"[{worker} trained] after re-enable ({kind}): {got:.3f} accepted drafts per verify step "
                       f"(accept length {1 + got:.2f}) against {want:.3f} ({1 + want:.2f}) always speculating on the "
                       f"same text: ratio {got / want if want else float('nan'):.3f}; {SURVIVORS} survivors, "
                       f"{off:.0f} tokens each before speculation came back")
    return out


@pytest.mark.parametrize("worker, kind", [("v1", "sync"), ("v2", "sync"), ("v2", "deferred")])
def test_acceptance_recovers_after_reenable(ctx: dict[str, Any], worker: str, kind: str) -> None:
    figures = H.once(f"reenable-{worker}", lambda: _measure(ctx, worker))
    got, want = figures[kind]
    assert want > 0, "the always-speculating reference accepted no draft token: the trained draft is broken"
    assert got >= ACCEPT_FLOOR * want, (f"{worker} ({kind}): after re-enable the survivors accept {got:.3f} drafts per "
                                        f"verify, below {ACCEPT_FLOOR} x the reference's {want:.3f}")


@pytest.mark.parametrize("worker", ["v1", "v2"])
def test_skipping_the_draft_sync_costs_acceptance(ctx: dict[str, Any], worker: str) -> None:
    figures = H.once(f"reenable-{worker}", lambda: _measure(ctx, worker))
    (synced, _), (skipped, _) = figures["sync"], figures["skip-sync"]
    assert skipped <= synced, f"{worker}: skipping the sync accepted more ({skipped:.3f}) than syncing ({synced:.3f})"
