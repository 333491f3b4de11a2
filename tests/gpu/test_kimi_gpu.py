"""The user's model family on a GPU: the Kimi-K2.5-shaped fixture (KimiK25ForConditionalGeneration,
MLA attention, MoE layers; bench/kimi_fixture.py) with EAGLE-3, on the MLA paths of the triton and
flashinfer attention backends. A switching server of each worker serves the ramp, runs both kinds of
step, replays DECODE graphs in fallback and gives the greedy outputs of a no-speculation server on
the same backend. That such a server starts at all is 0002's hooks at work: without them the
EAGLE-3 worker's first call on the wrapper raises AttributeError.

On the random pair, speculation gives tokens away from a near-tie of the no-speculation server even
before any switch (triton, 2026-12-01: at concurrency 2 a token outside the reference's top 5, at 5
one 0.125 nats below its best). A verify step computes the target over other shapes than a decode
step, and the likely cause (not yet isolated) is bf16 rounding flipping an MoE layer's expert choice,
which moves the logits far more than rounding does in a dense model. So that test holds the switch to
what an always-speculating server of the same worker gives on the same backend.

One backend per call fits the device's 10 minutes: `-k "kimi and triton"`, `-k "kimi and flashinfer"`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import gpu_harness as H
import greedy_compare as G
from gpu_harness import SUMMARY

pytestmark = [pytest.mark.gpu, pytest.mark.switch]

BACKENDS = ["triton", "flashinfer"]
# What SGLang 0.5.9 logs when the fused all-reduce's workspace is made (flashinfer_comm_fusion.py),
# which it does only at a TP size above 1: the flag SGLang turns on for this architecture on SM90
# must not fuse anything on one GPU.
FUSION_WORKSPACE_LINE = "FlashInfer workspace initialized"
CASES = [pytest.param(b, w, id=f"{b}-{w}") for b in BACKENDS for w in ("v1", "v2")]


@pytest.fixture(scope="module")
def ctx(sgl_tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    if H.tp_size() != 1:
        pytest.skip("the Kimi fixture tests run at TP 1")
    return H.ramp_context(sgl_tree, log_dir, fixture_models)


def _server_arg(log_text: str, name: str) -> str:
    m = re.search(rf"\b{name}=([^,)\s]+)", log_text)
    return m.group(1) if m else "?"


@pytest.mark.parametrize("backend,worker", CASES)
def test_ramp_both_kinds_and_graphs(ctx: dict[str, Any], backend: str, worker: str) -> None:
    run = H.switch_run(ctx, worker, "kimi-exact", backend)
    c = run.counters()
    in_range, eager = H.fallback_graph_replays(run)
    SUMMARY.append(
        f"[kimi {backend} {worker}] ramp: {len(run.results)} requests, {len(run.errors)} errors; counters "
        f"{c.as_dict() if c else None}; fallback decode lines with bs <= {H.CUDA_GRAPH_MAX_BS}: {len(in_range)}, "
        f"cuda graph True: {len(in_range) - len(eager)}; attention_backend={_server_arg(run.log_text, 'attention_backend')} "
        f"decode={_server_arg(run.log_text, 'decode_attention_backend')} "
        f"allreduce fusion={_server_arg(run.log_text, 'enable_flashinfer_allreduce_fusion')}, "
        f"its workspace initialized: {FUSION_WORKSPACE_LINE in run.log_text}"
    )
    assert FUSION_WORKSPACE_LINE not in run.log_text, (
        f"the fused all-reduce set up its workspace at TP 1 ({run.log_path})"
    )
    assert not run.errors, f"{len(run.errors)} request(s) failed, first: {run.errors[0]}\nlog: {run.log_path}"
    assert c is not None and c.spec_steps > 0 and c.fallback_steps > 0, f"counters {c} ({run.log_path})"
    assert in_range and not eager, f"fallback decode batches without a CUDA graph: {eager[:1]} ({run.log_path})"


@pytest.mark.parametrize("backend,worker", CASES)
def test_greedy_matches_nospec(ctx: dict[str, Any], backend: str, worker: str) -> None:
    ref = H.ref_run(ctx, "kimi-exact", backend)
    assert not ref.errors, f"reference server failed: {ref.errors[0]}"
    cmp = G.compare(H.switch_run(ctx, worker, "kimi-exact", backend), ref)
    SUMMARY.append(f"[kimi {backend} {worker} exact] {cmp.line()}")
    assert not cmp.not_near_tie, f"divergences where the target is not near a tie: {cmp.not_near_tie[:3]}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_pair_diverges_no_more_than_speculation_itself(ctx: dict[str, Any], backend: str) -> None:
    ref = H.ref_run(ctx, "kimi-random", backend)
    run = H.switch_run(ctx, "v2", "kimi-random", backend)
    control = H.always_run(ctx, "v2", "kimi-random", backend)
    failed = run.errors or ref.errors or control.errors
    assert not failed, failed[0]
    cmp, base = G.compare(run, ref), G.compare(control, ref)
    SUMMARY.append(f"[kimi {backend} v2 random] switch: {cmp.line()}")
    SUMMARY.append(f"[kimi {backend} v2 random] always speculating: {base.line()}")
    off, off_base = len(cmp.not_near_tie), len(base.not_near_tie)
    assert G.within_chance(off, off_base), (
        f"the switch gives {off} divergences off a near-tie where always speculating gives {off_base}: "
        f"first {cmp.not_near_tie[:3]}"
    )
