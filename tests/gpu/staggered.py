"""A load whose requests outlive an off period, for the draft catch-up's GPU tests.

The ramp's levels send requests of one length, which finish on one step, so speculation comes
back with nobody left behind. Here REQUESTS requests of staggered lengths start at once, above
H.DISABLE: speculation goes off; as the short ones finish, the batch falls below the on threshold
with the long ones still running, and the step that turns speculation back on must catch their
draft up in one extend. On the exact pair (no near-ties) their greedy outputs must equal a
no-speculation server's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.run import client

import gpu_harness as H
import greedy_compare as G
from gpu_harness import SUMMARY

REQUESTS = 3 * H.DISABLE // 2


def max_new_tokens(requests: int = REQUESTS) -> list[int]:
    """Each request's length, the shortest first."""
    return [24 + 16 * i for i in range(requests)]


def behind_when_back(on_at: int, requests: int = REQUESTS) -> list[int]:
    """Positions each request still running decoded while off, at the step where the batch has
    fallen to `on_at` (speculation back on): every request ends on the step of its length."""
    lengths = max_new_tokens(requests)
    back_at = lengths[requests - on_at - 1]  # the step on which the batch falls to on_at
    return [back_at for length in lengths if length > back_at]


def context(sgl_tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    prompts = [f"Request {i}. {p}" for i, p in enumerate(client.load_prompts()[:REQUESTS])]
    lengths = {
        p: {"sampling_params": {**H.GREEDY, "max_new_tokens": n}}
        for p, n in zip(prompts, max_new_tokens(len(prompts)), strict=True)
    }
    return {
        "tree": sgl_tree,
        "logs": log_dir,
        "models": H.models_for("exact", fixture_models),
        "prompts": prompts,
        "lengths": lengths,
    }


def serve(ctx: dict[str, Any], name: str, spec: Any) -> H.Run:
    return H.once(
        name,
        lambda: H.run_server(
            name, spec, ctx["tree"], ctx["logs"], [ctx["prompts"]], H.GREEDY, extra_by_prompt=ctx["lengths"]
        ),
    )


def assert_caught_up_exactly(ctx: dict[str, Any], run: H.Run, catch_up: str, label: str) -> None:
    """The run's speculation came back with a catch-up (its log line holds `catch_up`) and its
    outputs equal the no-speculation server's on the same load."""
    ref = serve(ctx, "catch-up-nospec", H.nospec_spec(ctx["models"], H.tp_size()))
    assert not run.errors and not ref.errors, f"requests failed: {(run.errors or ref.errors)[0]} ({run.log_path})"
    assert run.healthy_after, f"the server did not survive the run ({run.log_path})"
    caught_up = [line for line in run.log_text.splitlines() if catch_up in line]
    first = catch_up + caught_up[0].split(catch_up, 1)[1] if caught_up else "no catch-up"
    SUMMARY.append(f"[{label}] {first}; counters {run.counters()}")
    assert caught_up, f"speculation came back without a catch-up ({run.log_path})"
    cmp = G.compare(run, ref)
    SUMMARY.append(f"[{label}] {cmp.line()}")
    assert cmp.equal == cmp.total == REQUESTS, f"outputs differ from no-speculation greedy ones: {cmp.divergences[:2]}"
