"""Synthetic benchmark results the bench tests share (not a test module)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.results.records import ConfigRecord, LevelRecord, RunResults, SwitchCounters  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# Recorded logs, results and a stand-in tree, shared by the tests of every subpackage.
DATA = Path(__file__).parent / "data"
FAKE_TREE = DATA / "fake_tree"
LEVELS = [1, 2, 5, 10, 30, 70, 100, 250]
# anchors.md section 1: the user's 8x RTX PRO 6000 box, Kimi-K2.5, SGLang 0.5.9 (tok/s)
USER_SPEC = dict(zip(LEVELS, [77.5, 125.1, 183.2, 239.6, 299.5, 337.7, 338.8, 340.9], strict=False))
USER_NOSPEC = dict(zip(LEVELS, [92.6, 159.7, 292.5, 457.2, 711.0, 784.2, 761.6, 772.1], strict=False))


def run_fake_bench(out: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m bench ARGS` against the fake server of tests/bench/data/fake_tree, writing to out."""
    env = {**os.environ, "SGL_BASE_FLAGS": "", "PYTHONPATH": str(ROOT), **(env or {})}
    cmd = [sys.executable, "-m", "bench", "--tree", str(FAKE_TREE), *args, "--out", str(out), "--startup-timeout", "60"]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


def levels(series: dict[int, float], counters: bool = False) -> tuple[LevelRecord, ...]:
    return tuple(
        LevelRecord(
            concurrency=c,
            requests=max(30, c),
            output_tokens=int(v * 10),
            wall_s=10.0,
            tok_per_s=v,
            counters=SwitchCounters(5, 7, 2) if counters else None,
        )
        for c, v in series.items()
    )


def user_results() -> RunResults:
    switch = {c: max(USER_NOSPEC[c], USER_SPEC[c]) * (0.97 if c != 10 else 0.9) for c in LEVELS}
    return RunResults(
        meta={"model": "kimi", "tp": 8},
        configs={
            "nospec": ConfigRecord(flags=(), levels=levels(USER_NOSPEC)),
            "spec": ConfigRecord(flags=("--speculative-algorithm", "EAGLE3"), levels=levels(USER_SPEC)),
            "switch-v1": ConfigRecord(
                flags=("--speculative-algorithm", "EAGLE3", "--speculative-disable-batch-size", "0"),
                compare_to=("nospec", "spec"),
                levels=levels(switch, counters=True),
            ),
        },
    )


def stepwise_greedy_margin(model: Any, row: list[int], new_tokens: int) -> float:
    """A reference for bench.models.tie_free: one prompt, no padding and no KV cache, the whole sequence
    recomputed at every step; the least lead of the greedy token over the runner-up, in nats."""
    import torch

    ids, least = list(row), float("inf")
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()
            top2 = torch.log_softmax(logits, -1).topk(2)
            least = min(least, float(top2.values[0] - top2.values[1]))
            ids.append(int(top2.indices[0]))
    return least


class LocalServer:
    """A threaded HTTP server on a free local port that answers each POST with
    `answer(path, json_body) -> (status, reply bytes)`; a context manager, `url` its address."""

    def __init__(self, answer: Callable[[str, dict[str, Any]], tuple[int, bytes]]) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                status, reply = answer(self.path, body)
                self.send_response(status)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
