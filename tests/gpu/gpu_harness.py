"""Helpers for the GPU tests: server specs, the concurrency ramp, runs and their logs.

Only one server runs at a time (each takes most of the GPU's memory): a run starts its server,
sends its load, keeps the outputs, counters and log text, and stops it.
"""

from __future__ import annotations

import json
import os
import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from bench.configs import EAGLE_V1, EAGLE_V2, V2_ENV, steps_in
from bench.results.logparse import Counters, parse_log, parse_metrics
from bench.run import client
from bench.run.server import Server, ServerSpec, base_flags, cuda_graph_max_bs_flag, resolve_tree

RAMP = [1, 2, 5, 10, 30, 70, 100, 250, 10, 1]
NEW_TOKENS = int(os.environ.get("SGL_TEST_NEW_TOKENS", "32"))
_sw = os.environ.get("SGL_TEST_SWITCH", "8,4").split(",")
DISABLE, ENABLE = int(_sw[0]), int(_sw[1])
CUDA_GRAPH_MAX_BS = int(os.environ.get("SGL_TEST_CUDA_GRAPH_MAX_BS", "64"))
STARTUP_TIMEOUT = float(os.environ.get("SGL_TEST_STARTUP_TIMEOUT", "900"))
WORKERS: dict[str, tuple[list[str], dict[str, str]]] = {
    "v1": (EAGLE_V1, {}),
    "v2": (EAGLE_V2, dict(V2_ENV)),
}
GREEDY = {"temperature": 0.0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
# What a reference run asks for, so a divergence's gap can be read off the no-speculation server.
REFERENCE_LOGPROBS = {"return_logprob": True, "top_logprobs_num": 5}
LOGS_SEEN: list[Path] = []
_RUNS: dict[str, Any] = {}


def num_steps(worker: str) -> int:
    """The worker's --speculative-num-steps: the most drafts one verify step can accept."""
    return steps_in(WORKERS[worker][0])


# The steps an adaptive tier file gives the v2 worker below the tier.
V2_STEPS = num_steps("v2")


def once(key: str, make: Any) -> Any:
    """Each server run once per session, shared by the tests that read it; a failed start is
    remembered, so every test of this run reports the same failure."""
    if key not in _RUNS:
        try:
            _RUNS[key] = make()
        except Exception as e:
            _RUNS[key] = e
    if isinstance(_RUNS[key], Exception):
        raise _RUNS[key]
    return _RUNS[key]


SUMMARY: list[str] = []  # lines for pytest's terminal summary (and $SGL_TEST_LOG_DIR/summary.txt)


class FixtureSets:
    """The generated fixture sets, each made on first use: the tiny set holds the exact and random
    pairs, the trained set (made on this GPU, a few minutes) the trained ones."""

    def __init__(self) -> None:
        self._sets: dict[str, Any] = {}

    def get(self, preset: str) -> Any:
        from bench.models import fixtures

        if preset not in self._sets:
            fx = fixtures.generate(fixtures.PRESETS[preset])
            self._sets[preset] = fx
            if preset.startswith("trained"):
                SUMMARY.append("trained fixtures: " + trained_summary(fx.root))
        return self._sets[preset]

    def _set_of(self, kind: str) -> Any:
        return self.get(next((p for p in ("trained", "kimi") if kind.startswith(p)), "tiny"))

    def pair(self, kind: str) -> tuple[Path, Path]:
        return self._set_of(kind).pair(kind)

    def prompts(self, kind: str) -> list[str] | None:
        """The set's own prompts, or None where the ramp's shared ones serve."""
        path = self._set_of(kind).prompts_file()
        return client.load_prompts(path) if path else None


def trained_summary(root: Path) -> str:
    m = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    f, sec, pr = m["figures"], m["seconds"], m.get("prompts", {})
    prompts = (
        f"prompts {pr['count']} of {pr['candidates']} held-out snippets, least greedy margin "
        f"{pr['least_margin']:.4f} nats over {pr['new_tokens']} tokens; "
        if "candidates" in pr
        else ""
    )
    return (
        f"{root.name}: target loss {f['target_loss']:.3f} nats/token held-out (train {f['target_train_loss']:.3f}); "
        f"draft top-1 agreement per step {[round(a, 3) for a in f['draft_agreement']]} (chain estimate of the "
        f"accept length {f['draft_expected_accept_length']:.2f}); corpus {m['corpus']['files']} files, "
        f"{m['corpus']['bytes']} bytes, {m['corpus']['tokens']} tokens; draft/target weights "
        f"{m['draft_to_target_weights']:.4f}; {prompts}{_nondeterministic(f)}seconds: "
        + ", ".join(f"{k} {v:.0f}" for k, v in sec.items())
    )


def _nondeterministic(figures: dict[str, Any]) -> str:
    if "nondeterministic" not in figures:  # a set made before the generator recorded it
        return ""
    return f"nondeterministic kernels in training: {'; '.join(figures['nondeterministic']) or 'none'}; "


@dataclass(frozen=True)
class Models:
    target: str
    draft: str | None
    user: bool


def models_for(pair: str, fixture_models: Any) -> Models:
    user = os.environ.get("SGL_TEST_MODEL")
    if user:
        if pair != "exact":
            pytest.skip("SGL_TEST_MODEL is set: the random-draft pair exists only for the fixture models")
        draft = os.environ.get("SGL_TEST_DRAFT_MODEL")
        if not draft:
            pytest.skip("SGL_TEST_MODEL is set but SGL_TEST_DRAFT_MODEL is not")
        return Models(user, draft, True)
    t, d = fixture_models.pair(pair)
    return Models(str(t), str(d), False)


def tp_size() -> int:
    return int(os.environ.get("SGL_TEST_TP", "1"))


def common_flags(max_running_requests: int | None = 256) -> list[str]:
    """max_running_requests None: leave it to the server's own default."""
    cap = [] if max_running_requests is None else ["--max-running-requests", str(max_running_requests)]
    return (
        base_flags()
        + [
            "--enable-metrics",
            *cap,
            cuda_graph_max_bs_flag(resolve_tree()),
            str(CUDA_GRAPH_MAX_BS),
            "--decode-log-interval",
            "1",
        ]
        + shlex.split(os.environ.get("SGL_TEST_EXTRA_FLAGS", ""))
    )


def switch_spec(
    models: Models,
    worker: str,
    tp: int,
    *,
    disable: int = DISABLE,
    enable: int = ENABLE,
    extra: list[str] | None = None,
    max_running_requests: int | None = 256,
) -> ServerSpec:
    flags, env = WORKERS[worker]
    sw = ["--speculative-disable-batch-size", str(disable), "--speculative-enable-batch-size", str(enable)]
    return ServerSpec(
        models.target, models.draft, tp, common_flags(max_running_requests) + flags + sw + (extra or []), dict(env)
    )


def auto_switch_spec(models: Models, worker: str, tp: int, extra: list[str] | None = None) -> ServerSpec:
    """The worker with the switch's thresholds learned from its step costs (0014)."""
    flags, env = WORKERS[worker]
    return ServerSpec(
        models.target,
        models.draft,
        tp,
        common_flags() + flags + ["--speculative-disable-batch-size", "auto"] + (extra or []),
        dict(env),
    )


def always_spec(models: Models, worker: str, tp: int, extra: list[str] | None = None) -> ServerSpec:
    """The worker speculating at every batch size (no switch flags)."""
    flags, env = WORKERS[worker]
    return ServerSpec(models.target, models.draft, tp, common_flags() + flags + (extra or []), dict(env))


def nospec_spec(models: Models, tp: int, extra: list[str] | None = None) -> ServerSpec:
    return ServerSpec(models.target, None, tp, common_flags() + (extra or []))


def ramp_prompts(levels: list[int] = RAMP, base: list[str] | None = None) -> list[list[str]]:
    """Distinct prompts per request across the whole ramp, grouped by level: the shared prompts
    numbered ("Request k. ..."), or base as it is (it must hold one prompt per request)."""
    numbered = base is None
    base = client.load_prompts() if base is None else base
    if not numbered and len(set(base)) < sum(levels):
        raise ValueError(f"{len(set(base))} distinct prompts for a ramp of {sum(levels)} requests")
    out, k = [], 0
    for c in levels:
        out.append([f"Request {k + i}. {base[(k + i) % len(base)]}" if numbered else base[k + i] for i in range(c)])
        k += c
    return out


def pair_flags(pair: str) -> list[str]:
    """Flags every ramp server of this pair gets (ref_run and the worker runs alike; the acceptance
    tests' servers keep the pair's plain flags, the same on both sides of their ratio). The trained pair's
    greedy divergences sat at exact float16 logit ties (gaps of 0 and one float16 step, 2^-7):
    logits in float32 leave those to the hidden states' own rounding. Not for a model of the
    user's own (SGL_TEST_MODEL), whose LM head in float32 could take gigabytes per step."""
    return ["--enable-fp32-lm-head"] if pair.startswith("trained") and not os.environ.get("SGL_TEST_MODEL") else []


def groups_for(ctx: dict[str, Any], pair: str) -> list[list[str]]:
    """The ramp for this pair: the fixture set's own prompts where it has them (the trained target
    learned code, so its ramp is held-out code), else the shared ones."""
    own = None if os.environ.get("SGL_TEST_MODEL") else ctx["fx"].prompts(pair)
    return ctx["groups"] if own is None else ramp_prompts(base=own)


@dataclass
class Run:
    name: str
    results: list[client.Result]
    log_text: str
    log_path: Path
    metrics: Counters | None
    level_walls: list[tuple[int, float]] = field(default_factory=list)
    healthy_after: bool = True  # /health answered once the load was served

    @property
    def errors(self) -> list[str]:
        return [r.error for r in self.results if r.error]

    def counters(self, rank: int = 0) -> Counters | None:
        """From /metrics when exported, else from the log's last state line."""
        if self.metrics is not None:
            return self.metrics
        rl = parse_log(self.log_text).get(rank)
        return rl.counters if rl else None


def fresh_log(log_dir: Path, name: str) -> Path:
    """The server log of this run: the server appends, so an earlier run's log is removed first."""
    log = log_dir / f"{name}.log"
    if log.exists():
        log.unlink()
    LOGS_SEEN.append(log)
    return log


def run_server(
    name: str,
    spec: ServerSpec,
    tree: Path,
    log_dir: Path,
    groups: list[list[str]],
    sampling: dict[str, Any],
    extra: dict[str, Any] | None = None,
    fixed_concurrency: int | None = None,
    extra_by_prompt: dict[str, dict[str, Any]] | None = None,
) -> Run:
    """Start a server, send each group with concurrency = its size (or fixed), stop it."""
    log = fresh_log(log_dir, name)
    results: list[client.Result] = []
    walls: list[tuple[int, float]] = []
    with Server(spec, log, tree) as srv:
        for g in groups:
            lr = client.run_level(
                srv.url, g, fixed_concurrency or len(g), sampling, extra=extra, extra_by_prompt=extra_by_prompt
            )
            results.extend(lr.results)
            walls.append((len(g), lr.wall_s))
        healthy = client.is_healthy(srv.url)
        metrics = parse_metrics(client.get_metrics(srv.url))
    return Run(name, results, log.read_text(encoding="utf-8", errors="replace"), log, metrics, walls, healthy)


def reference(
    name: str,
    models: Models,
    tree: Path,
    log_dir: Path,
    prompts: list[str],
    tp: int = 1,
    flags: list[str] | None = None,
) -> Run:
    """No-speculation greedy outputs with the top-5 logprobs at every output position."""
    return run_server(
        name, nospec_spec(models, tp, flags), tree, log_dir, [prompts], GREEDY, REFERENCE_LOGPROBS, fixed_concurrency=64
    )


def ramp_context(tree: Path, log_dir: Path, fixture_models: Any) -> dict[str, Any]:
    """What the ramp tests share: the tree, the log folder, the fixture sets and the ramp's prompts."""
    return {"tree": tree, "logs": log_dir, "fx": fixture_models, "groups": ramp_prompts()}


def _backend(backend: str | None) -> tuple[list[str], str]:
    """Flags and a name suffix for an attention backend other than the base flags' own (the last
    --attention-backend on the command line wins)."""
    return (["--attention-backend", backend], f"-{backend}") if backend else ([], "")


def ref_run(ctx: dict[str, Any], pair: str, backend: str | None = None) -> Run:
    """The no-speculation server on the whole ramp (once per session, pair and backend)."""
    flags, suffix = _backend(backend)
    flags += pair_flags(pair)

    def serve() -> Run:
        flat = [p for g in groups_for(ctx, pair) for p in g]
        return reference(
            f"nospec-{pair}{suffix}", models_for(pair, ctx["fx"]), ctx["tree"], ctx["logs"], flat, tp_size(), flags
        )

    return once(f"ref-{pair}{suffix}", serve)


def _worker_run(
    ctx: dict[str, Any], prefix: str, make_spec: Callable[..., ServerSpec], worker: str, pair: str, backend: str | None
) -> Run:
    """A server of make_spec's kind for this worker serving the ramp (once per session, worker, pair
    and backend); prefix names its log."""
    models = models_for(pair, ctx["fx"])
    flags, suffix = _backend(backend)
    spec = make_spec(models, worker, tp_size(), extra=flags + pair_flags(pair))
    name = f"{prefix}-{worker}-{pair}{suffix}"
    return once(name, lambda: run_server(name, spec, ctx["tree"], ctx["logs"], groups_for(ctx, pair), GREEDY))


def switch_run(ctx: dict[str, Any], worker: str, pair: str, backend: str | None = None) -> Run:
    return _worker_run(ctx, "switch", switch_spec, worker, pair, backend)


def auto_switch_run(ctx: dict[str, Any], worker: str, pair: str, backend: str | None = None) -> Run:
    return _worker_run(ctx, "switch-auto", auto_switch_spec, worker, pair, backend)


def always_run(ctx: dict[str, Any], worker: str, pair: str, backend: str | None = None) -> Run:
    """The worker speculating at every batch size, on the same ramp."""
    return _worker_run(ctx, "spec", always_spec, worker, pair, backend)


def accepted_drafts(meta: dict[str, Any]) -> int:
    """Draft tokens a request's verify steps accepted (the bonus token not counted), under the name
    its release reports them: spec_accept_token_num in 0.5.9, spec_num_correct_drafts in 0.5.15 and 0.5.23."""
    for key in ("spec_accept_token_num", "spec_num_correct_drafts"):
        if key in meta:
            return int(meta[key])
    return 0


def fallback_decode_lines(run: Run, disable: int, rank: int = 0) -> list[Any]:
    """Decode log lines written while speculation was off (state from the log, else bs > N + 1)."""
    rl = parse_log(run.log_text).get(rank)
    if not rl:
        return []
    out = []
    for d in rl.decode:
        off = (d.spec_on is False) if d.spec_on is not None else d.batch_size > disable + 1
        if off:
            out.append(d)
    return out


def adaptive_state_switches(log_text: str) -> list[str]:
    """Upstream's --speculative-adaptive log of its state swaps ("<from> -> <to>" steps), in order."""
    marker = "Switch adaptive runtime state"
    return [line.split(marker + ": ")[-1] for line in log_text.splitlines() if marker in line]


def fallback_graph_replays(run: Run) -> tuple[list[Any], list[Any]]:
    """The fallback decode log lines at batch sizes with a captured graph, and those of them that ran
    eagerly (what the graph tests require to be none)."""
    lines = fallback_decode_lines(run, DISABLE)
    in_range = [d for d in lines if d.batch_size <= CUDA_GRAPH_MAX_BS and d.cuda_graph is not None]
    return in_range, [d for d in in_range if not d.cuda_graph]


def parallel(fn: Any, items: list[Any], n: int = 8) -> list[Any]:
    with ThreadPoolExecutor(max_workers=n) as ex:
        return list(ex.map(fn, items))
