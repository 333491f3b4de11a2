"""Synthetic benchmark results and expectations the bench tests share (not a test module)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.results.records import ConfigRecord, LevelRecord, RunResults  # noqa: E402
from bench.results.switch_counters import SwitchCounters  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# Recorded logs, results and a stand-in tree, shared by the tests of every subpackage.
DATA = Path(__file__).parent / "data"
FAKE_TREE = DATA / "fake_tree"
LEVELS = [1, 2, 5, 10, 30, 70, 100, 250]
# anchors.md section 1: the user's 8x RTX PRO 6000 box, Kimi-K2.5, SGLang 0.5.9 (tok/s)
USER_SPEC = dict(zip(LEVELS, [77.5, 125.1, 183.2, 239.6, 299.5, 337.7, 338.8, 340.9], strict=False))
USER_NOSPEC = dict(zip(LEVELS, [92.6, 159.7, 292.5, 457.2, 711.0, 784.2, 761.6, 772.1], strict=False))
# The tensors of an EAGLE-3 draft checkpoint, as SGLang's LlamaForCausalLMEagle3 loads them.
DRAFT_NAMES = {
    "fc.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
}


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


def decode_level(c: int, out: float, decode: float, threshold: int | None = None) -> LevelRecord:
    """A level with its output and steady decode-step rates (and a learned threshold)."""
    return LevelRecord(
        concurrency=c,
        requests=3 * c,
        output_tokens=int(out),
        wall_s=1.0,
        tok_per_s=out,
        decode_tok_per_s=decode,
        decode_lines=4,
        switch_threshold=threshold,
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


class StreamingServer:
    """A stand-in for SGLang's streamed /generate on a free local port (aiohttp, on its own thread's
    loop): each request's first chunk after `first_delay` s, then one chunk every `chunk_delay` s,
    each `tokens_per_chunk` tokens more (cumulative text and completion_tokens, as SGLang sends
    them), then `data: [DONE]`. Prompt "fail" gets HTTP 500, "error-chunk" SGLang's error chunk,
    "no-token" only [DONE], "garbled" a chunk that is not JSON. `arrivals`: when each request came (time.perf_counter), `most`: the
    most requests it held at once."""

    def __init__(self, first_delay: float = 0.0, chunk_delay: float = 0.0, tokens_per_chunk: int = 1) -> None:
        import asyncio
        import threading

        self.first_delay, self.chunk_delay, self.tokens_per_chunk = first_delay, chunk_delay, tokens_per_chunk
        self.arrivals: list[float] = []
        self.most = self._inflight = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _serve(self) -> None:
        import asyncio

        from aiohttp import web

        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/generate", self._generate)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        self._ready.set()
        self._loop.run_forever()

    async def _generate(self, request: Any) -> Any:
        import asyncio
        import json
        import time

        from aiohttp import web

        self.arrivals.append(time.perf_counter())
        body = await request.json()
        if body["text"] == "fail":
            return web.Response(status=500, text="boom")
        self._inflight += 1
        self.most = max(self.most, self._inflight)
        try:
            reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await reply.prepare(request)
            n = body["sampling_params"]["max_new_tokens"]
            await asyncio.sleep(self.first_delay)
            if body["text"] == "error-chunk":
                await reply.write(b'data: {"error": {"message": "bad"}}\n\n')
            if body["text"] == "garbled":
                await reply.write(b"data: {oops\n\n")
            tokens = (
                ()
                if body["text"] in ("error-chunk", "no-token", "garbled")
                else range(self.tokens_per_chunk, n + 1, self.tokens_per_chunk)
            )
            for k in tokens:
                if k > self.tokens_per_chunk:
                    await asyncio.sleep(self.chunk_delay)
                chunk = {"text": "t" * k, "meta_info": {"completion_tokens": k}}
                await reply.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await reply.write(b"data: [DONE]\n\n")
            return reply
        finally:
            self._inflight -= 1

    def __enter__(self) -> StreamingServer:
        return self

    def __exit__(self, *exc: object) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
