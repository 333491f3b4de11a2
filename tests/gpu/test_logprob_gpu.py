"""Logprob requests in the load of an EAGLE-3 server (0009): a tenth of a ramp's requests ask for
top-3 logprobs, of the output only or from the prompt start. Unpatched 0.5.9, the first of them
kills a v2 server; the v1 worker served them. Outputs and logprobs are checked against a
no-speculation server's for the same requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

import gpu_harness as H
import greedy_compare as G
from gpu_harness import SUMMARY

pytestmark = [pytest.mark.gpu, pytest.mark.switch]
RAMP = [1, 5, 30, 70, 10, 1]  # crosses the switch threshold both ways
LOGPROB_TOL = 0.05
OUTPUT_ONLY = {"return_logprob": True, "top_logprobs_num": 3}
FROM_START = {"return_logprob": True, "top_logprobs_num": 3, "logprob_start_len": 0}


@pytest.fixture(scope="session")
def load(sgl_tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    groups = H.ramp_prompts(RAMP)
    flat = [p for g in groups for p in g]
    asks = {p: (OUTPUT_ONLY if k % 20 == 3 else FROM_START) for k, p in enumerate(flat) if k % 10 == 3}
    return {
        "tree": sgl_tree,
        "logs": log_dir,
        "models": H.models_for("exact", fixture_models),
        "groups": groups,
        "asks": asks,
    }


def _run(load: dict[str, Any], name: str, spec_of: Callable[[H.Models], Any]) -> H.Run:
    return H.once(
        name,
        lambda: H.run_server(
            f"logprob-{name}",
            spec_of(load["models"]),
            load["tree"],
            load["logs"],
            load["groups"],
            H.GREEDY,
            extra_by_prompt=load["asks"],
        ),
    )


def reference(load: dict[str, Any]) -> H.Run:
    # Every request asks, so divergences can be told from near-ties; the asked-for fields are a subset.
    everyone = {
        p: {"return_logprob": True, "top_logprobs_num": 5, "logprob_start_len": 0} for g in load["groups"] for p in g
    }
    return H.once(
        "nospec",
        lambda: H.run_server(
            "logprob-nospec",
            H.nospec_spec(load["models"], H.tp_size()),
            load["tree"],
            load["logs"],
            load["groups"],
            H.GREEDY,
            extra_by_prompt=everyone,
        ),
    )


SERVERS = {
    "switch-v2": lambda m: H.switch_spec(m, "v2", H.tp_size()),
    "spec-v2": lambda m: H.always_spec(m, "v2", H.tp_size()),
    "switch-v1": lambda m: H.switch_spec(m, "v1", H.tp_size()),
}


def _values(entries: list[Any] | None) -> list[float]:
    # SGLang returns (logprob, token id, text) per position; the first input position has no logprob.
    return [float(e[0]) for e in (entries or []) if e[0] is not None]


@dataclass(frozen=True)
class Returned:
    positions: int  # where both servers returned a logprob
    of: int  # where the reference returned one
    max_gap: float

    def line(self) -> str:
        return f"{self.positions} of {self.of} positions (max |diff| {self.max_gap:.4f})"


def _returned(run: H.Run, ref: H.Run, field: str, prompts: list[str]) -> Returned:
    """How much of `field` came back, and how far from the reference, where both returned it.

    0.5.9's v2 worker returns output logprobs for the first token only (the prefill samples it);
    a server may return fewer positions than the reference, never others."""
    by_prompt = {r.prompt: r for r in ref.results}
    n, of, worst = 0, 0, 0.0
    for r in run.results:
        if r.prompt not in prompts or r.error:
            continue
        mine, theirs = _values(r.meta.get(field)), _values(by_prompt[r.prompt].meta.get(field))
        assert len(mine) <= len(theirs), f"{field} of {r.prompt[:40]!r}: {len(mine)} values, reference {len(theirs)}"
        n, of = n + len(mine), of + len(theirs)
        worst = max([worst] + [abs(a - b) for a, b in zip(mine, theirs, strict=False)])
    return Returned(n, of, worst)


@pytest.mark.parametrize("server", SERVERS)
def test_logprob_requests_in_the_load(load: dict[str, Any], server: str) -> None:
    ref = reference(load)
    assert not ref.errors, f"reference server failed: {ref.errors[0]}"
    run = _run(load, server, SERVERS[server])
    asked = list(load["asks"])
    from_start = [p for p, a in load["asks"].items() if "logprob_start_len" in a]
    cmp = G.compare(run, ref)
    out = _returned(run, ref, "output_token_logprobs", asked)
    inp = _returned(run, ref, "input_token_logprobs", from_start)
    SUMMARY.append(
        f"[logprob {server}] {len(run.results)} requests, {len(asked)} asking for logprobs "
        f"({len(from_start)} from the prompt start): {len(run.errors)} errors, healthy after: {run.healthy_after}; "
        f"{cmp.line()}; output logprobs returned at {out.line()}, input logprobs at {inp.line()}; "
        f"log {run.log_path}"
    )
    assert not run.errors, f"{len(run.errors)} request(s) failed, first: {run.errors[0]}\nlog: {run.log_path}"
    assert run.healthy_after, f"the server did not answer /health after the load ({run.log_path})"
    assert not cmp.not_near_tie, f"greedy outputs diverge from no-spec away from near-ties: {cmp.not_near_tie[0]}"
    assert inp.positions == inp.of > 0, f"input logprobs (from the prompt start): {inp.line()}"
    assert out.positions >= len(asked), f"not even the first output token's logprob came back: {out.line()}"
    assert out.max_gap <= LOGPROB_TOL and inp.max_gap <= LOGPROB_TOL
