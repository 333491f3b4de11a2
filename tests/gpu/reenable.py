"""What the acceptance-after-re-enable tests share (ours and upstream's adaptive mode): the load
that sends speculation off and back on with requests alive through it, and how it is served.

One batch of BURST short requests and SURVIVORS long ones (BURST + SURVIVORS > N) starts with
speculation off; once the short ones finish, the survivors are at most M and speculation comes
back. Their verify steps from then on are compared with an always-speculating server's on the same
text: each survivor's prompt plus the tokens it decoded before speculation came back, continued for
the same number of tokens.

A draft left stale while off reads whatever its KV slots held. On a fresh server those are
never-used slots, zeros (memory_pool.py), which the trained draft barely notices: upstream's skip
variable accepted 0.897x and 1.054x of always speculating on two runs' texts (GPU, 18 and 21).
A warm server's slots hold other requests' draft KV. `serve(..., used_pool=True)` first fills a
small pool (`used_pool_flags`, `fill_ids`): the allocator hands out its never-used slots before freed ones
(mem_cache/allocator/token.py), so the burst and the survivors then decode into slots the radix
cache evicted from the fill.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace
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
# The used pool: FILL requests of FILL_TOKENS prompt tokens each take 96% of POOL_TOKENS, and the
# load (28 requests of about 50 prompt tokens at the default 8,4: about 13,000 tokens at most)
# fits in it without a retraction.
POOL_TOKENS = 20_000
FILL, FILL_TOKENS = 8, 2_400


def burst_lengths() -> list[int]:
    return [SHORT] * BURST + [LONG] * SURVIVORS


def trained_context(tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    """The trained pair and the load's prompts as token ids (sent as ids: both servers see the same)."""
    from transformers import AutoTokenizer

    models = H.models_for("trained", fixture_models)
    tok = AutoTokenizer.from_pretrained(models.target)
    prompts = client.load_prompts()[: BURST + SURVIVORS]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    return {"tree": tree, "logs": log_dir, "models": models, "ids": ids, "vocab_size": tok.vocab_size}


def used_pool_flags() -> list[str]:
    return ["--max-total-tokens", str(POOL_TOKENS)]


def fill_ids(vocab_size: int) -> list[list[int]]:
    """Prompts of seeded random token ids: none shares a prefix with the load or another."""
    rng = random.Random(0)
    return [[rng.randrange(vocab_size) for _ in range(FILL_TOKENS)] for _ in range(FILL)]


def pool_tokens(log_text: str, log: Path) -> int:
    """The KV pool the server allocated, in tokens (its start-up line)."""
    found = re.search(r"max_total_num_tokens=(\d+)", log_text)
    assert found, f"the server logged no max_total_num_tokens ({log})"
    return int(found.group(1))


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
    name: str,
    spec: ServerSpec,
    ctx: dict[str, Any],
    ids: list[list[int]],
    max_new: list[int],
    used_pool: bool = False,
) -> tuple[list[dict[str, Any]], Path]:
    """The load on a fresh server; with used_pool, on a pool of POOL_TOKENS the fill's prompts (one
    token each) went through first."""
    log = H.fresh_log(ctx["logs"], name)
    if used_pool:
        spec = replace(spec, flags=spec.flags + used_pool_flags())
    with Server(spec, log, ctx["tree"]) as srv:
        if used_pool:
            generate(srv.url, fill_ids(ctx["vocab_size"]), [1] * FILL)
        out = generate(srv.url, ids, max_new)
    if used_pool:
        pool = pool_tokens(log.read_text(errors="replace"), log)
        assert pool == POOL_TOKENS, f"{name}: a pool of {pool} tokens, not the used pool's {POOL_TOKENS} ({log})"
    return out, log


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
