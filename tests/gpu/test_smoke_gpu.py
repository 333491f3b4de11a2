"""Any line's tree on a GPU, switch or not: a plain server and an always-speculating EAGLE-3 server
on the v2 worker serve the ramp, their greedy outputs agree on the exact pair, and the SM120 patch's
gates stay shut on a GPU that is not SM120. The one GPU test of a line that does not carry the switch
(v0.5.15); on the default line it runs beside the switch tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.run.server import server_env

import gpu_harness as H
import greedy_compare as G
from gpu_harness import SUMMARY

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ctx(sgl_tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    return H.ramp_context(sgl_tree, log_dir, fixture_models)


def plain_run(ctx: dict[str, Any]) -> H.Run:
    models = H.models_for("exact", ctx["fx"])
    spec = H.nospec_spec(models, H.tp_size())
    return H.once(
        "smoke-plain",
        lambda: H.run_server(
            "smoke-plain-exact", spec, ctx["tree"], ctx["logs"], ctx["groups"], H.GREEDY, H.REFERENCE_LOGPROBS
        ),
    )


def spec_v2_run(ctx: dict[str, Any]) -> H.Run:
    return H.always_run(ctx, "v2", "exact")


@pytest.mark.parametrize("server", ["plain", "spec-v2"])
def test_serves_the_ramp(ctx: dict[str, Any], server: str) -> None:
    run = plain_run(ctx) if server == "plain" else spec_v2_run(ctx)
    ramp = ",".join(map(str, H.RAMP))
    line = f"[smoke {server}] ramp {ramp}: {len(run.results)} requests, {len(run.errors)} errors"
    verify = sum(int(r.meta.get("spec_verify_ct") or 0) for r in run.results if not r.error)
    if server == "spec-v2":
        tokens = sum(r.completion_tokens for r in run.results if not r.error)
        line += f"; {verify} verify steps, accept length {tokens / verify:.2f}" if verify else "; no verify step"
    SUMMARY.append(f"{line}; log {run.log_path}")
    assert not run.errors, f"{len(run.errors)} request(s) failed, first: {run.errors[0]}\nlog: {run.log_path}"
    short = [r for r in run.results if r.completion_tokens != H.NEW_TOKENS]
    assert not short, f"{len(short)} request(s) did not produce {H.NEW_TOKENS} tokens (ignore_eos is set)"
    if server == "spec-v2":
        assert verify > 0, f"the EAGLE-3 server reported no verify step: it did not speculate ({run.log_path})"
    else:
        assert verify == 0, f"the plain server reported {verify} verify steps"


def test_speculative_greedy_matches_plain(ctx: dict[str, Any]) -> None:
    cmp = G.compare(spec_v2_run(ctx), plain_run(ctx))
    SUMMARY.append(f"[smoke spec-v2 exact] {cmp.line()}")
    assert not cmp.not_near_tie, f"greedy outputs diverge where the target is not near a tie: {cmp.not_near_tie[0]}"


SM120_PROBE = """
import json, torch
from sglang.srt.utils import is_sm120_supported
import sglang.srt.layers.communicator as communicator
print(json.dumps({"capability": list(torch.cuda.get_device_capability()),
                  "is_sm120_supported": bool(is_sm120_supported()),
                  "communicator_admits_sm120": bool(communicator._is_sm120_supported)}))
"""


def test_sm120_paths_stay_off(sgl_tree: Path) -> None:
    """0001's gates evaluated on this GPU, in the tree's own import of SGLang."""
    proc = subprocess.run(
        [sys.executable, "-c", SM120_PROBE], env=server_env(sgl_tree), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"the probe failed:\n{proc.stderr[-3000:]}"
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    SUMMARY.append(f"[smoke sm120 gates] {got}")
    if got["capability"][0] == 12:
        pytest.skip("this GPU is SM120: the gates are meant to be open here")
    assert not got["is_sm120_supported"] and not got["communicator_admits_sm120"], (
        f"an SM120 code path is enabled on a GPU of capability {got['capability']}: {got}"
    )
