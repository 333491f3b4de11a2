"""Greedy outputs of a GPU test's run against a reference run's: where each request first
diverges, and whether that is at a near-tie (the target's own top logprobs say how far below its
best token the run's choice lies)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from bench.run import client

from gpu_harness import Run

TIE_TOL = float(os.environ.get("SGL_TEST_TIE_TOL", "0.1"))  # nats below the target's best token


def within_chance(count: int, control: int, sigmas: float = 3.0) -> bool:
    """Whether a run's count of divergences off a near-tie exceeds a control run's by no more than
    chance: under the same rate the difference of two such counts has a standard deviation of about
    sqrt(count + control)."""
    return count - control <= sigmas * math.sqrt(count + control)


def _ids(r: client.Result) -> list[Any]:
    return list(r.output_ids) if r.output_ids else list(r.text)


@dataclass
class Comparison:
    total: int
    equal: int
    divergences: list[dict[str, Any]]  # first divergence of each differing request
    skipped: int = 0  # requests that failed on either server

    @property
    def rate(self) -> float:
        return self.equal / self.total if self.total else 0.0

    @property
    def not_near_tie(self) -> list[dict[str, Any]]:
        return [d for d in self.divergences if not d["near_tie"]]

    def line(self) -> str:
        gaps = [d["gap"] for d in self.divergences if d["gap"] is not None]
        s = f"greedy match {self.equal}/{self.total} ({100 * self.rate:.2f}%)"
        if self.skipped:
            s += f" ({self.skipped} failed requests left out)"
        if self.divergences:
            s += (
                f"; {len(self.divergences)} diverge, {len(self.divergences) - len(self.not_near_tie)} at a near-tie"
                f" (logprob within {TIE_TOL} of the target's best)" + (f", max gap {max(gaps):.4f}" if gaps else "")
            )
        return s


def compare(spec_run: Run, ref_run: Run) -> Comparison:
    by_prompt = {r.prompt: r for r in ref_run.results}
    equal, divs, skipped = 0, [], 0
    for r in spec_run.results:
        ref = by_prompt[r.prompt]
        if r.error or ref.error:  # failed requests are the ramp test's business
            skipped += 1
            continue
        a, b = _ids(r), _ids(ref)
        if a == b:
            equal += 1
            continue
        i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
        tops = ref.meta.get("output_top_logprobs") or []
        gap, in_top = None, False
        if i < len(tops) and tops[i] and i < len(a):
            # How far below the target's own best token the token the switching server chose
            # lies (bf16 random weights tie often, sometimes among more than two tokens).
            chosen = [float(t[0]) for t in tops[i] if t[1] == a[i]]
            in_top = bool(chosen)
            if in_top:
                gap = float(tops[i][0][0]) - chosen[0]
        divs.append(
            {
                "prompt": r.prompt[:60],
                "pos": i,
                "spec": a[i] if i < len(a) else None,
                "ref": b[i] if i < len(b) else None,
                "gap": gap,
                "near_tie": gap is not None and gap <= TIE_TOL and in_top,
            }
        )
    return Comparison(len(spec_run.results) - skipped, equal, divs, skipped)
