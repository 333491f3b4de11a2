"""What the acceptance-after-re-enable tests share (ours and upstream's adaptive mode): the load
that sends speculation off and back on with requests alive through it, and how it is served.

One batch of BURST short requests and SURVIVORS long ones (BURST + SURVIVORS > N) starts with
speculation off; once the short ones finish, the survivors are at most M and speculation comes
back. Their verify steps from then on are compared with an always-speculating server's on the same
text: each survivor's prompt plus the tokens it decoded before speculation came back, continued for
the same number of tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from bench.results.logparse import parse_log
from bench.run import client
from bench.run.server import Server, ServerSpec

import gpu_harness as H

SURVIVORS = H.ENABLE
BURST = 3 * H.DISABLE
# The survivors decode SHORT tokens while speculation is off: hundreds, so that a draft left stale
# (upstream's skip variable) is told from one caught up; at 48 the two accepted alike (GPU, 6).
LONG, SHORT = 640, 384
ACCEPT_FLOOR = 0.95


def burst_lengths() -> list[int]:
    return [SHORT] * BURST + [LONG] * SURVIVORS


def trained_context(tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    """The trained pair and the load's prompts as token ids (sent as ids: both servers see the same)."""
    from transformers import AutoTokenizer

    models = H.models_for("trained", fixture_models)
    tok = AutoTokenizer.from_pretrained(models.target)
    prompts = client.load_prompts()[: BURST + SURVIVORS]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    return {"tree": tree, "logs": log_dir, "models": models, "ids": ids}


def generate(url: str, ids: list[list[int]], max_new: list[int]) -> list[dict[str, Any]]:
    """One batch request, so every request reaches the scheduler at once."""
    body: dict[str, Any] = {
        "input_ids": ids,
        "sampling_params": [{"temperature": 0.0, "max_new_tokens": m, "ignore_eos": True} for m in max_new],
    }
    r = requests.post(url + "/generate", json=body, timeout=600)
    assert r.status_code == 200, f"HTTP {r.status_code}: {r.text[:500]}"
    out: list[dict[str, Any]] = r.json()
    return out


def serve(
    name: str, spec: ServerSpec, ctx: dict[str, Any], ids: list[list[int]], max_new: list[int]
) -> tuple[list[dict[str, Any]], Path]:
    log = H.fresh_log(ctx["logs"], name)
    with Server(spec, log, ctx["tree"]) as srv:
        return generate(srv.url, ids, max_new), log


def reference(
    ctx: dict[str, Any], name: str, spec: ServerSpec, continuations: list[list[int]], lengths: list[int]
) -> float:
    """Accepted drafts per verify step of an always-speculating server on these continuations."""
    out, _ = serve(name, spec, ctx, continuations, lengths)
    return drafts_per_verify([(int(r["meta_info"]["spec_verify_ct"]), H.accepted_drafts(r["meta_info"])) for r in out])


def drafts_per_verify(pairs: list[tuple[int, int]]) -> float:
    """(verify steps, accepted drafts) pairs: accepted drafts per verify step over all of them."""
    return sum(a for _, a in pairs) / max(1, sum(v for v, _ in pairs))


@dataclass(frozen=True)
class AfterBurst:
    """What the steps after the burst did: tokens per request per step, and how many tokens each
    survivor had decoded before them."""

    accept_len: float
    steps: int
    before: int


def after_burst(log_text: str, log: Path) -> AfterBurst:
    """From the decode lines after the last one with more than SURVIVORS requests (one step each,
    --decode-log-interval 1). The first of them is left out of the accept length: under the overlap
    scheduler it may log the last steps=0 step."""
    rank = parse_log(log_text).get(0)
    lines = rank.decode if rank else []
    busy = [i for i, d in enumerate(lines) if d.batch_size > SURVIVORS]
    assert busy, f"no decode step ran with more than {SURVIVORS} requests ({log})"
    after = [(d.accept_len, d.batch_size) for d in lines[busy[-1] + 1 :] if d.accept_len is not None]
    assert len(after) > 1, f"no speculative decode line after the burst ({log})"
    measured = after[1:]
    accept_len = sum(a * bs for a, bs in measured) / sum(bs for _, bs in measured)
    return AfterBurst(accept_len, len(measured), LONG - round(sum(a * bs for a, bs in after) / SURVIVORS))
