"""Speculation must not change what a request asks for (0010-0013; on the v0.5.15 line its penalty
patch): logit_bias, stop strings and penalties on speculating servers, against a plain server,
greedy, over the harness's ramp (it crosses the switch's thresholds both ways). Each line runs the
servers its SGLang has: the v0.5.9 line both workers and switches, v0.5.15 the v2 worker and
upstream's adaptive mode.

Each request of the ramp asks for one kind. The reference is a plain server without the overlap
scheduler: with it, SGLang's own plain decoding counts the penalties one token late, so only the
non-overlap server decodes as penalties are defined (each step counts every output token so far).
A speculating server must return the same ids, text and completion_tokens, except where the
reference's top two tokens are a near-tie.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.configs import ZERO_STEP_PLAIN_DECODE, write_off_above_tiers
from bench.run.server import missing_environ, missing_server_args, tree_has_switch

import gpu_harness as H
import greedy_compare as G
from gpu_harness import SUMMARY

pytestmark = pytest.mark.gpu  # which servers a tree can run: _unsupported
PAIR = "trained"
STEPS = H.V2_STEPS
NEW_TOKENS = 48
# Stops the trained target's code writes often: one-character, one-token and multi-token ones.
STOPS = [["("], [")"], [":"], ["):"], ["self."], ["return"], ["\n    "], [", "], ["= "], ["()"]]


def _logit_bias(k: int) -> dict[str, Any]:
    # Forced (+100: the token wins everywhere), banned (-100) and nudged (+4: sometimes wins).
    token = str(40 + k % 60)
    return {"logit_bias": {token: (100.0, -100.0, 4.0)[k % 3]}}


def _stop(k: int) -> dict[str, Any]:
    return {"stop": STOPS[k % len(STOPS)]}


def _penalty(k: int) -> dict[str, Any]:
    return ({"frequency_penalty": 0.8}, {"presence_penalty": 0.8}, {"frequency_penalty": 0.4, "presence_penalty": 0.4})[
        k % 3
    ]


KINDS: dict[str, Callable[[int], dict[str, Any]]] = {"logit_bias": _logit_bias, "stop": _stop, "penalty": _penalty}


@pytest.fixture(scope="session")
def load(sgl_tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    ctx = H.ramp_context(sgl_tree, log_dir, fixture_models)
    groups = H.groups_for(ctx, PAIR)
    greedy = {**H.GREEDY, "max_new_tokens": NEW_TOKENS}
    kind_of, asks = {}, {}
    for k, prompt in enumerate(p for g in groups for p in g):
        kind = list(KINDS)[k % len(KINDS)]
        kind_of[prompt] = kind
        asks[prompt] = {"sampling_params": {**greedy, **KINDS[kind](k // len(KINDS))}}
    return {**ctx, "groups": groups, "kind_of": kind_of, "asks": asks, "models": H.models_for(PAIR, fixture_models)}


def _serve(load: dict[str, Any], name: str, spec: Any, logprobs: bool = False) -> H.Run:
    extra = H.REFERENCE_LOGPROBS if logprobs else None
    return H.once(
        f"sampling-{name}",
        lambda: H.run_server(
            f"sampling-{name}",
            spec,
            load["tree"],
            load["logs"],
            load["groups"],
            H.GREEDY,
            extra,
            extra_by_prompt=load["asks"],
        ),
    )


def reference(load: dict[str, Any]) -> H.Run:
    flags = H.pair_flags(PAIR) + ["--disable-overlap-schedule"]
    return _serve(load, "nospec", H.nospec_spec(load["models"], H.tp_size(), flags), logprobs=True)


def _adaptive(load: dict[str, Any], plain_decode: bool) -> Any:
    """Upstream's --speculative-adaptive (the v0.5.15 line) with the tier file `make bench` writes:
    3 steps up to the switch's threshold, 0 above; plain_decode: 0002's steps=0 plain decodes."""
    name = "adaptive-plain-v2" if plain_decode else "adaptive-v2"
    tiers = write_off_above_tiers(load["logs"] / f"sampling-{name}-tiers.json", H.DISABLE, STEPS)
    spec = H.always_spec(
        load["models"],
        "v2",
        H.tp_size(),
        extra=["--speculative-adaptive", "--speculative-adaptive-config", str(tiers), *H.pair_flags(PAIR)],
    )
    # "0": upstream's steps=0 on a line's tree, where the plain decode is the default.
    return dataclasses.replace(spec, env={**spec.env, ZERO_STEP_PLAIN_DECODE: "1" if plain_decode else "0"})


SERVERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "spec-v1": lambda load: H.always_spec(load["models"], "v1", H.tp_size(), H.pair_flags(PAIR)),
    "spec-v2": lambda load: H.always_spec(load["models"], "v2", H.tp_size(), H.pair_flags(PAIR)),
    "switch-v1": lambda load: H.switch_spec(load["models"], "v1", H.tp_size(), extra=H.pair_flags(PAIR)),
    "switch-v2": lambda load: H.switch_spec(load["models"], "v2", H.tp_size(), extra=H.pair_flags(PAIR)),
    "adaptive-plain-v2": lambda load: _adaptive(load, plain_decode=True),
    "adaptive-v2": lambda load: _adaptive(load, plain_decode=False),
}


def _unsupported(tree: Path, server: str) -> str | None:
    """Why the tree's SGLang cannot run a server of the table (each line runs the ones it has)."""
    if server.endswith("v1") and not (tree / "python/sglang/srt/speculative/eagle_worker.py").is_file():
        return "the v1 EAGLEWorker is gone from this release"
    if server.startswith("switch") and not tree_has_switch(tree):
        return "this line has no speculation switch (lines/<ref>/NOTES.md)"
    if server.startswith("adaptive") and missing_server_args(tree, ["speculative_adaptive"]):
        return "this release has no --speculative-adaptive"
    if server == "adaptive-plain-v2" and missing_environ(tree, [ZERO_STEP_PLAIN_DECODE]):
        return f"this tree does not read {ZERO_STEP_PLAIN_DECODE} (the v0.5.15 line's 0002)"
    return None


def _only(run: H.Run, prompts: set[str]) -> H.Run:
    return H.Run(run.name, [r for r in run.results if r.prompt in prompts], run.log_text, run.log_path, run.metrics)


def _mismatches(run: H.Run, ref: H.Run, prompts: set[str]) -> list[tuple[Any, Any]]:
    """(result, reference) pairs whose text or completion_tokens differ (ids are compare's)."""
    by_prompt = {r.prompt: r for r in ref.results}
    pairs = [(r, by_prompt[r.prompt]) for r in run.results if r.prompt in prompts]
    return [
        (r, b)
        for r, b in pairs
        if not r.error and not b.error and (r.text, r.completion_tokens) != (b.text, b.completion_tokens)
    ]


def _describe(result: Any, reference: Any) -> str:
    return (
        f"{result.prompt[:40]!r}: {result.completion_tokens} tokens {result.text[-30:]!r}, "
        f"reference {reference.completion_tokens} {reference.text[-30:]!r}"
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("server", SERVERS)
def test_outputs_equal_a_plain_servers(load: dict[str, Any], server: str, kind: str) -> None:
    if why := _unsupported(load["tree"], server):
        pytest.skip(f"{server}: {why}")
    ref = reference(load)
    assert not ref.errors, f"reference server failed: {ref.errors[0]}"
    run = _serve(load, server, SERVERS[server](load))
    assert not run.errors, f"{len(run.errors)} request(s) failed, first: {run.errors[0]}\nlog: {run.log_path}"
    prompts = {p for p, k in load["kind_of"].items() if k == kind}
    cmp = G.compare(_only(run, prompts), ref)
    off = cmp.not_near_tie
    unequal = _mismatches(run, ref, prompts)
    SUMMARY.append(
        f"[sampling {server} {kind}] {cmp.line()}; text or completion_tokens differ in "
        f"{len(unequal)}; log {run.log_path}"
    )
    assert not off, f"{len(off)} {kind} request(s) diverge away from near-ties, first: {off[0]}"
    # A near-tie divergence changes the text too; compare keys divergences by the prompt's first 60 characters.
    tied = {d["prompt"] for d in cmp.divergences}
    unequal = [(r, b) for r, b in unequal if r.prompt[:60] not in tied]
    assert not unequal, f"{len(unequal)} {kind} request(s) return other text or counts, first: {_describe(*unequal[0])}"
