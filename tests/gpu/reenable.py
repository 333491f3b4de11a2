"""What the acceptance-after-re-enable tests share (ours and upstream's adaptive mode): the load
that sends speculation off and back on with requests alive through it, and how it is served.

One batch of BURST short requests and SURVIVORS long ones (BURST + SURVIVORS > N) starts with
speculation off; once the short ones finish, the survivors are at most M and speculation comes
back. Their verify steps from then on are compared with an always-speculating server's on the same
text: each survivor's prompt plus the tokens it decoded before its first verify step but the last,
so that the reference's first verify step drafts the same tokens.

Two windows. The first EARLY_STEPS verify steps are where a stale draft shows: with upstream's
skip variable its first proposals are zero stubs (eagle_worker_v2.py, _stub_skipped_draft_extend)
and its KV misses the whole off period, so it accepts little until its own new rows make up the
context it attends to. On the trained pair that took 3-4 verify steps: over the first 8 the skip
case accepted 0.74 (used pool) and 0.84 (fresh pool) of always speculating, read from the logs of
GPU 22 and 21, whose tests, reading the whole rest of the request, had given 1.037 and 1.054:
that window cannot tell a stale draft from a kept one. It is still compared, as a check that
nothing goes wrong later.

A stale span reads whatever its KV slots held. On a fresh server those are never-used slots,
zeros (memory_pool.py); a warm server's hold other requests' draft KV, which cost the stale draft
more (the figures above). `serve(..., used_pool=True)` first fills a small pool (`used_pool_flags`,
`fill_ids`): the allocator hands out its never-used slots before freed ones
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

from bench.results.logparse import DecodeLine, parse_log
from bench.run import client
from bench.run.server import Server, ServerSpec

import gpu_harness as H

SURVIVORS = H.ENABLE
BURST = 3 * H.DISABLE
# The survivors decode SHORT tokens while speculation is off: hundreds, so that a draft left stale
# (upstream's skip variable) is told from one caught up; at 48 the two accepted alike (GPU, 6).
LONG, SHORT = 640, 384
ACCEPT_FLOOR = 0.95
# Verify steps right after re-enable that the early window covers: the stale draft's deficit sits in
# the first 3-4 on the trained pair; over 16 the text's own swings hid it (0.97, GPU 22).
EARLY_STEPS = 8
# The step that turns speculation back on logs this where it caught the draft up (both lines' catch-up).
CATCH_UP_LOG = "draft caught up over"
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


@dataclass(frozen=True)
class Acceptance:
    """Accepted drafts per verify step over the first EARLY_STEPS verify steps and over all of them."""

    early: float
    tail: float

    def ratio(self, reference: Acceptance) -> Acceptance:
        return Acceptance(_ratio(self.early, reference.early), _ratio(self.tail, reference.tail))


def _ratio(got: float, want: float) -> float:
    return got / want if want else float("nan")


def reference(
    ctx: dict[str, Any],
    name: str,
    spec: ServerSpec,
    survivors: list[tuple[list[int], list[int], int]],
) -> Acceptance:
    """An always-speculating server on (prompt ids, output ids, tokens before its first verify step)
    of each survivor: the prompt plus those tokens but the last, whose prefill decodes that last token,
    so that its first verify step drafts what the survivor's first one drafted. Served once per load
    and module: cases that decoded the same tokens (upstream's steps=0 with and without the skip
    variable) share it, a server start less on the GPU."""
    continuations = [ids + out[: before - 1] for ids, out, before in survivors]
    lengths = [len(out) - before + 1 for _, out, before in survivors]
    served: dict[str, Acceptance] = ctx.setdefault("references", {})
    key = repr((spec, continuations, lengths))
    if key not in served:
        out, log = serve(name, spec, ctx, continuations, lengths)
        meta = [r["meta_info"] for r in out]
        tail = drafts_per_verify([(int(m["spec_verify_ct"]), H.accepted_drafts(m)) for m in meta])
        served[key] = Acceptance(first_verifies_after_prefill(log.read_text(errors="replace"), log), tail)
    return served[key]


def first_verifies_after_prefill(log_text: str, log: Path) -> float:
    """Accepted drafts per verify step over the first EARLY_STEPS decode lines after the last prefill."""
    rank = parse_log(log_text).get(0)
    lines = rank.decode if rank else []
    prefilled = [i for i, d in enumerate(lines) if d.prefills]
    assert prefilled, f"no decode step after a prefill ({log})"
    early = lines[prefilled[-1] :][:EARLY_STEPS]
    assert len(early) == EARLY_STEPS and all(d.batch_size == SURVIVORS and d.accept_len is not None for d in early), (
        f"expected {EARLY_STEPS} verify steps of all {SURVIVORS} continuations after their prefill ({log}): "
        f"{[d.line for d in early[:2]]}"
    )
    return drafts_per_line(early)


def drafts_per_line(lines: list[DecodeLine]) -> float:
    """Accepted drafts per verify step over decode lines of one verify step each (their accept
    lengths checked by the caller): each line is its batch's verify steps."""
    return drafts_per_verify([(d.batch_size, d.batch_size * ((d.accept_len or 1.0) - 1)) for d in lines])


def compared(got: Acceptance, want: Acceptance) -> str:
    """Both windows against the reference, for the summary and the failures."""
    r = got.ratio(want)
    return (
        f"first {EARLY_STEPS} verify steps {got.early:.3f} accepted drafts per step against {want.early:.3f} "
        f"always speculating on the same text (ratio {r.early:.3f}); all {got.tail:.3f} against "
        f"{want.tail:.3f} (ratio {r.tail:.3f})"
    )


def assert_draft_current(label: str, got: Acceptance, want: Acceptance) -> None:
    """A draft kept or caught up accepts ACCEPT_FLOOR of always speculating in both windows."""
    assert want.early > 0 and want.tail > 0, "the always-speculating reference accepted no draft: the draft is broken"
    r = got.ratio(want)
    assert r.early >= ACCEPT_FLOOR and r.tail >= ACCEPT_FLOOR, (
        f"{label}: below {ACCEPT_FLOOR} x always speculating after re-enable: {compared(got, want)}"
    )


def drafts_per_verify(pairs: list[tuple[int, float]]) -> float:
    """(verify steps, accepted drafts) pairs: accepted drafts per verify step over all of them."""
    return sum(a for _, a in pairs) / max(1, sum(v for v, _ in pairs))


@dataclass(frozen=True)
class AfterBurst:
    """The verify steps after the burst: accepted drafts per verify step in the two windows, how many
    steps, and how many tokens each survivor had decoded before the first of them."""

    acceptance: Acceptance
    steps: int
    before: int


def after_burst(log_text: str, log: Path) -> AfterBurst:
    """From the decode lines after the last one with more than SURVIVORS requests (one step each,
    --decode-log-interval 1). Every off step ran with more (the burst's requests, all of one length,
    leave the batch together, and speculation comes back once they have), so the first of them is
    the step that turned speculation back on: a verify, or where the log says the draft was caught
    up, the catch-up, which verifies nothing (0.5.15 logs it as a verify that accepted no draft,
    0.5.9 without an accept length) and is left out."""
    rank = parse_log(log_text).get(0)
    lines = rank.decode if rank else []
    busy = [i for i, d in enumerate(lines) if d.batch_size > SURVIVORS]
    assert busy, f"no decode step ran with more than {SURVIVORS} requests ({log})"
    first = busy[-1] + 1 + int(CATCH_UP_LOG in log_text)
    verifies = lines[first:]
    assert len(verifies) >= EARLY_STEPS, f"fewer than {EARLY_STEPS} verify steps after the burst ({log})"
    unmeasured = [d.line for d in verifies if d.accept_len is None]
    assert not unmeasured, f"a verify step after the burst logged no accept length ({log}): {unmeasured[0]}"
    early = verifies[:EARLY_STEPS]
    assert all(d.batch_size == SURVIVORS for d in early), f"a survivor finished within {EARLY_STEPS} steps ({log})"
    acceptance = Acceptance(drafts_per_line(early), drafts_per_line(verifies))
    return AfterBurst(acceptance, len(verifies), _tokens_before(lines, first, log))


def _tokens_before(lines: list[DecodeLine], first_verify: int, log: Path) -> int:
    """Tokens each survivor decoded before the first verify step: its prefill's, then one a step.
    Counted from the start: a verify's accept length counts drafts past a request's last token."""
    load = [i for i, d in enumerate(lines) if d.batch_size == BURST + SURVIVORS]
    assert load and lines[load[0]].prefills, (
        f"the load's {BURST + SURVIVORS} requests were not prefilled at once ({log})"
    )
    return 1 + first_verify - load[0]
