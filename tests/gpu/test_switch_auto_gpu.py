"""The switch's learned thresholds on a GPU (0014, `--speculative-disable-batch-size auto`).

On the trained pair's 8B-shaped target the draft accepts most of what it proposes on the held-out
code prompts decoded greedily, so speculation pays at a batch of CONCURRENCY (on the H200 its
steps gained over plain ones up to a batch of about 47). Greedy decoding of prompts of random
characters was not enough of a change: the target falls into text the draft predicts (v2 accept
length 2.5 against 2.8 on code, the v1 threshold unmoved on the H200). Sampled at temperature 1
the draft's guesses rarely match the target's samples, so the second phase samples. One server
serves both in turn: its learned threshold must fall when the traffic changes, with every request
answered. On the Kimi-shaped exact pair (MLA, MoE), triton, the ramp must pass with `auto` as with
fixed thresholds. The speed figures are the benchmark's (`switch-v2-auto`, `switch-v1-auto`).
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest

from bench.results.logparse import parse_threshold
from bench.run import client
from bench.run.server import Server, missing_server_args

import gpu_harness as H
from gpu_harness import SUMMARY

pytestmark = pytest.mark.gpu
CONCURRENCY = 24
WAVES = 4
GREEDY = {**H.GREEDY, "max_new_tokens": 256}
SAMPLED = {**GREEDY, "temperature": 1.0}
CHANGE = re.compile(r"spec-switch: threshold (\d+) -> (\d+)")


@pytest.fixture(scope="module")
def ctx(sgl_tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    if missing_server_args(sgl_tree, ["speculative_auto_max_batch_size"]):
        pytest.skip(f"the SGLang in {sgl_tree} has no --speculative-disable-batch-size auto (0014)")
    return H.ramp_context(sgl_tree, log_dir, fixture_models)


def random_prompts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 {}()[]<>=+-*/#@$%&!?;:,."
    return ["".join(rng.choices(alphabet, k=400)) for _ in range(n)]


@pytest.mark.parametrize("worker", ["v2", "v1"])
def test_threshold_falls_when_acceptance_does(ctx: dict[str, Any], worker: str) -> None:
    models = H.models_for("trained-gpu-bound", ctx["fx"])
    code = ctx["fx"].prompts("trained") or client.load_prompts()
    n = CONCURRENCY * WAVES
    log = H.fresh_log(ctx["logs"], f"switch-auto-{worker}")
    thresholds: list[int | None] = []
    errors: list[str] = []
    with Server(H.auto_switch_spec(models, worker, H.tp_size()), log, ctx["tree"]) as srv:
        for prompts, sampling in ((client.prompts_for_level(code, n), GREEDY), (random_prompts(n), SAMPLED)):
            lr = client.run_level(srv.url, prompts, CONCURRENCY, sampling)
            errors += lr.errors
            thresholds.append(parse_threshold(client.get_metrics(srv.url)))
    changes = [(int(a), int(b)) for a, b in CHANGE.findall(log.read_text(errors="replace"))]
    SUMMARY.append(
        f"[switch auto {worker}, trained-gpu-bound pair, C={CONCURRENCY}] threshold after greedy code "
        f"prompts {thresholds[0]}, after sampled random ones {thresholds[1]}; changes {changes}"
    )
    assert not errors, errors[:3]
    on_code, on_random = thresholds
    assert on_code is not None and on_random is not None, "no sglang:spec_switch_threshold in /metrics"
    assert on_code >= CONCURRENCY, f"speculation pays on code prompts at {CONCURRENCY}: {thresholds}"
    assert on_random < CONCURRENCY, f"the threshold did not follow the acceptance down: {thresholds}"


@pytest.mark.parametrize("worker", ["v2", "v1"])
def test_kimi_ramp_with_auto_on_triton(ctx: dict[str, Any], worker: str) -> None:
    run = H.auto_switch_run(ctx, worker, "kimi-exact", "triton")
    counters = run.counters()
    SUMMARY.append(
        f"[switch auto {worker}, kimi triton] ramp: {len(run.results)} requests, {len(run.errors)} "
        f"errors; counters {counters.as_dict() if counters else None}"
    )
    assert not run.errors, run.errors[:3]
    assert run.healthy_after
