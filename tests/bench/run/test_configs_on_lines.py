"""The server command lines the benchmark and the GPU suite build parse with each release line's
own ServerArgs: the real SGLang of that line, in the line's own environment, with `--device cpu`.
A flag that a release renamed or removed fails here rather than on a GPU box (0.5.23 no longer
accepts `--cuda-graph-max-bs`, and declares its fields outside server_args.py).

A line is checked when its tree is built (`make apply [SGLANG_REF=<ref>]`) and its environment is
set up (`make test SGLANG_REF=<ref>`; the default line uses this one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.configs import CONFIGS
from bench.models.fixtures import FixtureParams, generate
from bench.results.records import RunResults
from bench.run import settings as run_settings
from bench.run import sweep
from bench.run.arguments import parser
from bench.run.server import ServerSpec, cuda_graph_max_bs_flag, missing_environ, missing_server_args
from tools.lockfile import read_lock
from tools.project import Project, default_root
from tools.versions import release_order

PROJECT = Project(default_root())

# Runs in the line's interpreter: parses each command line as `sglang.launch_server` does.
PARSE_EACH = """
import contextlib, io, json, os, sys
from sglang.srt.server_args import prepare_server_args
failures = {}
for case in json.load(sys.stdin):
    saved, said = dict(os.environ), io.StringIO()
    os.environ.update(case["env"])
    try:
        with contextlib.redirect_stderr(said):
            prepare_server_args(case["argv"])
    except BaseException as e:  # argparse exits with its message on stderr; a check raises
        failures[case["name"]] = f"{type(e).__name__}: {e} {said.getvalue()[-300:]}"
    finally:
        os.environ.clear()
        os.environ.update(saved)
print(json.dumps(failures))
"""


def _lines() -> list[Any]:
    out = []
    for line in PROJECT.all_lines():
        lock = read_lock(line.lock_path)
        ref = line.line or (lock.ref if lock else None)
        if ref is None:
            continue
        python = Path(sys.executable) if line.line is None else line.line_python
        out.append(pytest.param(ref, python, id=ref))
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    target, draft = generate(FixtureParams(), tmp_path_factory.mktemp("fixtures"), quiet=True).pair("exact")
    return str(target), str(draft)


def _case(name: str, spec: ServerSpec) -> dict[str, Any]:
    """What the line's interpreter parses: the command line after `python -m sglang.launch_server`."""
    return {"name": name, "argv": spec.argv(30000)[3:] + ["--device", "cpu"], "env": spec.env}


def _bench_cases(tree: Path, models: tuple[str, str], out: Path) -> list[dict[str, Any]]:
    """Every config the benchmark would serve from this tree, with the flags it would pass."""
    settings = run_settings.RunSettings.from_args(parser().parse_args(["--switch-thresholds", "4,3"]))
    results = RunResults(meta={})
    cases = []
    for cfg in CONFIGS.values():
        if missing_server_args(tree, cfg.server_args_needed()) or missing_environ(tree, list(cfg.env_needed)):
            continue  # the bench refuses it on this tree, by name (test_bench_adaptive)
        flags = sweep.server_flags(cfg, settings, results, out)
        cases.append(_case(cfg.name, ServerSpec(models[0], models[1], 1, flags, dict(cfg.env))))
    return cases


def _gpu_suite_cases(tree: Path, models: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    monkeypatch.setenv("SGLANG_TREE", str(tree))
    monkeypatch.syspath_prepend(str(default_root() / "tests" / "gpu"))
    import gpu_harness as H

    pair = H.Models(models[0], models[1], False)
    specs = {"gpu-suite nospec": H.nospec_spec(pair, 1), "gpu-suite spec-v2": H.always_spec(pair, "v2", 1)}
    if not missing_server_args(tree, ["speculative_disable_batch_size"]):
        specs.update({f"gpu-suite switch-{w}": H.switch_spec(pair, w, 1) for w in H.WORKERS})
    return [_case(n, s) for n, s in specs.items()]


@pytest.mark.parametrize("ref,python", _lines())
def test_every_server_command_line_parses_with_the_lines_sglang(
    ref: str, python: Path, models: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = PROJECT.tree_for(ref)
    if not (tree / "python" / "sglang" / "srt" / "server_args.py").is_file():
        pytest.skip(f"no tree at {tree}: make apply SGLANG_REF={ref}")
    if not python.is_file():
        pytest.skip(f"no environment for this line at {python}: make test SGLANG_REF={ref}")
    cases = _bench_cases(tree, models, tmp_path) + _gpu_suite_cases(tree, models, monkeypatch)
    env = {**os.environ, "PYTHONPATH": str(tree / "python")}
    res = subprocess.run(
        [str(python), "-c", PARSE_EACH], input=json.dumps(cases), capture_output=True, text=True, env=env, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    failures = json.loads(res.stdout.strip().splitlines()[-1])
    assert not failures, "\n".join(f"{name}: {err[:400]}" for name, err in failures.items())
    offered = {c["name"] for c in cases}
    assert {"nospec", "spec-v2"} <= offered
    if release_order(ref) >= release_order("v0.5.11"):  # upstream's --speculative-adaptive
        assert {"adaptive-v2", "adaptive-v2-off"} <= offered, f"the bench refuses adaptive configs on {ref}"
    if ref == "v0.5.15":  # the line's plain-decode candidate (its 0002)
        assert {"adaptive-v2-off-plain", "adaptive-v2-off-plain-skip"} <= offered


def test_the_decode_graph_cap_flag_follows_the_release() -> None:
    names = {
        ref: cuda_graph_max_bs_flag(PROJECT.tree_for(ref))
        for ref in ("v0.5.9", "v0.5.15", "v0.5.23")
        if (PROJECT.tree_for(ref) / "python" / "sglang").is_dir()
    }
    if len(names) < 3:
        pytest.skip("needs the v0.5.9, v0.5.15 and v0.5.23 trees (make apply for each)")
    assert names == {
        "v0.5.9": "--cuda-graph-max-bs",
        "v0.5.15": "--cuda-graph-max-bs-decode",
        "v0.5.23": "--cuda-graph-max-bs-decode",
    }
