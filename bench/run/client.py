"""Load generation over SGLang's plain HTTP API (`/generate`, `/metrics`, `/flush_cache`).

A level's requests run on one asyncio loop through one aiohttp session, not a thread per request:
a level's requests finish together at the end of each wave and the next wave starts only as the
client answers them, and with `requests` in threads (under the GIL) a wave of 250 took about 0.29 s
to turn around on two cores (docs/measurements.md, 2026-12-02), time that lands in every wave
boundary of the measured server. One-off control calls (/flush_cache, /metrics) use `requests`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import aiohttp
import requests

from bench.errors import BenchError

DEFAULT_PROMPTS = Path(__file__).parents[1] / "data" / "coding_prompts.jsonl"


class ClientError(BenchError):
    """A request the benchmark needs was refused by the server."""


def load_prompts(path: Path | str | None = None) -> list[str]:
    """Prompts from a .jsonl ({"prompt": ...} per line), a .json list, or a text file (one per line)."""
    p = Path(path or DEFAULT_PROMPTS)
    text = p.read_text(encoding="utf-8")
    if p.suffix == ".jsonl":
        out = [json.loads(line)["prompt"] for line in text.splitlines() if line.strip()]
    elif p.suffix == ".json":
        data = json.loads(text)
        out = [d["prompt"] if isinstance(d, dict) else str(d) for d in data]
    else:
        out = [line for line in text.splitlines() if line.strip()]
    if not out:
        raise ValueError(f"no prompts in {p}")
    return out


def apply_chat_template(prompts: list[str], model: str) -> list[str]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    return [
        tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]


@dataclass
class Result:
    prompt: str
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    completion_tokens: int = 0
    latency: float = 0.0
    error: str | None = None
    started: float = 0.0  # seconds after its level began (run_level)
    meta: dict[str, Any] = field(default_factory=dict)


def _request(prompt: str, sampling: dict[str, Any], extra: dict[str, Any] | None) -> dict[str, Any]:
    return {"text": prompt, "sampling_params": sampling, **(extra or {})}


def _result(prompt: str, status: int, text: str, latency: float) -> Result:
    """The Result of a /generate reply: its output, or the error it is."""
    if status != 200:
        return Result(prompt, latency=latency, error=f"HTTP {status}: {text[:500]}")
    try:
        d = json.loads(text)
    except ValueError as e:
        return Result(prompt, latency=latency, error=f"{type(e).__name__}: {e}")
    meta = d.get("meta_info", {})
    ids = d.get("output_ids") or []
    return Result(
        prompt,
        text=d.get("text", ""),
        output_ids=list(ids),
        completion_tokens=int(meta.get("completion_tokens", len(ids))),
        latency=latency,
        meta=meta,
    )


async def _generate_async(
    session: aiohttp.ClientSession,
    url: str,
    prompt: str,
    sampling: dict[str, Any],
    timeout: float,
    extra: dict[str, Any] | None,
) -> Result:
    t0 = time.perf_counter()
    try:
        async with session.post(
            url + "/generate", json=_request(prompt, sampling, extra), timeout=aiohttp.ClientTimeout(total=timeout)
        ) as reply:
            status, text = reply.status, await reply.text(errors="replace")
    except asyncio.TimeoutError:
        return Result(prompt, latency=time.perf_counter() - t0, error=f"TimeoutError: no reply within {timeout:g} s")
    except aiohttp.ClientConnectorError as e:  # named by the OS's error: ConnectionRefusedError...
        return Result(prompt, latency=time.perf_counter() - t0, error=f"{type(e.os_error).__name__}: {e}")
    except (aiohttp.ClientError, OSError) as e:
        return Result(prompt, latency=time.perf_counter() - t0, error=f"{type(e).__name__}: {e}")
    return _result(prompt, status, text, time.perf_counter() - t0)


@dataclass
class LevelRun:
    concurrency: int
    wall_s: float
    results: list[Result]

    @property
    def errors(self) -> list[str]:
        return [r.error for r in self.results if r.error]

    @property
    def output_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.results if not r.error)

    @property
    def tok_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def _waves(self) -> list[list[Result]]:
        """The requests taken `concurrency` at a time in the order sent (a closed loop of
        equal-length requests runs them as waves); whole waves without a failed request only."""
        c = max(1, self.concurrency)
        waves = (self.results[i : i + c] for i in range(0, len(self.results) - c + 1, c))
        return [w for w in waves if not any(r.error for r in w)]

    def wave_tok_per_s(self) -> list[float]:
        """Each wave's output tok/s: its tokens over the span from its first start to its last
        finish. Their spread is the level's noise within the run: a slow wave boundary or first
        wave moves the level's rate without changing its steps."""
        rates = []
        for wave in self._waves():
            span = max(r.started + r.latency for r in wave) - min(r.started for r in wave)
            if span > 0:
                rates.append(sum(r.completion_tokens for r in wave) / span)
        return rates

    def wave_send_spread_s(self) -> list[float]:
        """Each wave's span of send times: the client's share of a slow wave boundary, to set
        beside the server's log (a wave sent over a long span starts as a small batch, which a
        switch that decides by batch size answers by speculating)."""
        return [max(r.started for r in w) - min(r.started for r in w) for w in self._waves()]


def run_level(
    url: str,
    prompts: list[str],
    concurrency: int,
    sampling: dict[str, Any],
    *,
    extra: dict[str, Any] | None = None,
    timeout: float = 600.0,
    on_done: Callable[[int, int], None] | None = None,
    extra_by_prompt: dict[str, dict[str, Any]] | None = None,
    max_new_tokens: Sequence[int] | None = None,
) -> LevelRun:
    """Send every prompt, at most `concurrency` in flight (closed loop: a request is sent as one
    finishes, in the prompts' order); time the whole level.

    extra_by_prompt: request fields for some prompts only, over `extra`; max_new_tokens: each
    prompt's, over the sampling's."""
    if max_new_tokens is not None and len(max_new_tokens) != len(prompts):
        raise ValueError(f"{len(max_new_tokens)} output lengths for {len(prompts)} prompts")
    samplings = (
        [sampling] * len(prompts)
        if max_new_tokens is None
        else [{**sampling, "max_new_tokens": n} for n in max_new_tokens]
    )
    return asyncio.run(
        _run_level(url, prompts, concurrency, samplings, extra or {}, timeout, on_done, extra_by_prompt or {})
    )


async def _run_level(
    url: str,
    prompts: list[str],
    concurrency: int,
    samplings: Sequence[dict[str, Any]],
    extra: dict[str, Any],
    timeout: float,
    on_done: Callable[[int, int], None] | None,
    by_prompt: dict[str, dict[str, Any]],
) -> LevelRun:
    results: list[Result | None] = [None] * len(prompts)
    pending = iter(range(len(prompts)))
    done = 0
    t0 = time.perf_counter()

    async def sender(session: aiohttp.ClientSession) -> None:
        nonlocal done
        for i in pending:  # one shared iterator: each sender takes the next prompt when it is free
            started = time.perf_counter() - t0
            fields = {**extra, **by_prompt.get(prompts[i], {})}
            res = await _generate_async(session, url, prompts[i], samplings[i], timeout, fields)
            res.started = started
            results[i] = res
            done += 1
            if on_done:
                on_done(done, len(prompts))

    # No connection limit of the session's own: the senders are the level's concurrency.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(sender(session) for _ in range(max(1, min(concurrency, len(prompts))))))
    return LevelRun(concurrency, time.perf_counter() - t0, [r for r in results if r is not None])


def prompts_for_level(prompts: list[str], n: int, offset: int = 0) -> list[str]:
    """n prompts cycling through the set; a suffix keeps repeats distinct (no prefix-cache shortcut)."""
    out = []
    for i in range(n):
        k = offset + i
        p = prompts[k % len(prompts)]
        out.append(p if k < len(prompts) else f"{p}\n(variant {k // len(prompts)})")
    return out


def flush_cache(url: str) -> None:
    try:
        requests.post(url + "/flush_cache", timeout=30)
    except requests.RequestException:
        pass


def freeze_gc(url: str) -> None:
    """Freeze the server's garbage collector: objects alive now are never scanned again."""
    try:
        r = requests.post(url + "/freeze_gc", timeout=60)
    except requests.RequestException as e:
        raise ClientError(f"--freeze-gc: POST {url}/freeze_gc failed: {e}") from None
    if r.status_code != 200:
        raise ClientError(
            f"--freeze-gc: POST {url}/freeze_gc answered {r.status_code} {r.text[:200]!r}: this "
            "SGLang has no /freeze_gc; run without --freeze-gc"
        )


def is_healthy(url: str) -> bool:
    """The server answers /health (its scheduler is alive)."""
    try:
        return requests.get(url + "/health", timeout=30).status_code == 200
    except requests.RequestException:
        return False


def get_metrics(url: str) -> str:
    try:
        r = requests.get(url + "/metrics", timeout=30)
        return r.text if r.status_code == 200 else ""
    except requests.RequestException:
        return ""
