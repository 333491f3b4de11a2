"""The open loop: requests sent at Poisson arrivals of a given rate, whatever the server has in flight,
each streamed from SGLang's /generate, measured as SGLang's `python -m sglang.bench_serving
--backend sglang --request-rate R` measures them.

Why our own client and not bench_serving itself. bench_serving cannot be imported where the benchmark
runs: it imports `datasets` (and PIL) at the top, which neither the offline GPU bundle
(ci/gpu/wheels.txt) nor this project's environment carries, and its request functions read a
module-global argparse namespace. Its datasets do not take our prompt files with a fixed output
length either (its `custom` set wants conversations and shuffles them), and it tokenizes every
prompt and output with the model's tokenizer. So this module repeats, line for line where it
matters, what 0.5.9's bench_serving does, and the figures keep its meaning:

- arrivals (`get_request`): the first request at once, then each after an interval drawn with
  `np.random.exponential(1 / rate)`; `np.random.RandomState(seed)` draws the same numbers as
  bench_serving's `np.random.seed(seed)` (its default seed is 1). Every config and rate starts from
  the seed, so each config meets the same arrival pattern. We send at the intervals' running sums
  rather than sleeping each interval after the send, so that the client's own time does not stretch
  the schedule. `inf`: all requests at once.
- the request (`async_request_sglang_generate`): POST /generate with `"stream": true`; a chunk
  with non-empty `text` is a token event; the first gives TTFT; each later one adds its gap,
  split evenly over the tokens it brought (`meta_info.completion_tokens` growth), to the ITLs;
  a request's latency runs to its last chunk (`[DONE]`); its output tokens are the last
  `completion_tokens` seen.
- the metrics (`calculate_metrics`): over completed requests, TTFT; TPOT = (latency - TTFT) /
  (output tokens - 1) for requests of more than one token; ITL; np.median and np.percentile(.., 99);
  output tok/s and request/s over the wall time from the first send to the last completion.
`settle` (the sweep's --rate-settle) is ours: the rate's first requests are sent and answered but
not measured, so that the measured ones meet the rate's steady state.
Where we differ, bench_serving would count a failure as a success: a stream that carries SGLang's
`{"error": ...}` chunk, or ends without a token, is an error here (bench_serving counts the latter
as the full requested length).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from bench.results.open_records import OpenRateRecord

READ_BUFSIZE = 10 * 1024**2  # bench_serving's: a long output's cumulative text must fit one line


@dataclass
class StreamOutput:
    """One streamed request, as bench_serving's RequestFuncOutput holds it (times in seconds)."""

    success: bool = False
    latency: float = 0.0  # send to the last chunk
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_len: int = 0
    error: str = ""
    start_time: float = 0.0  # after the rate's start


def arrival_offsets(n: int, rate: float, seed: int) -> list[float]:
    """When each of n requests is sent, in seconds after the first: bench_serving's draws."""
    if n <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    gaps = np.random.RandomState(seed).exponential(1.0 / rate, size=n - 1)
    return [0.0, *(float(t) for t in np.cumsum(gaps))]


def _chunks_to_output(out: StreamOutput, chunk: dict[str, Any], now: float, state: dict[str, float]) -> None:
    """One parsed chunk into out (bench_serving's loop body); state: the last token time and count."""
    if "error" in chunk:
        out.error = f"stream error: {json.dumps(chunk['error'])[:500]}"
        return
    if not chunk.get("text"):
        return
    n = int(chunk.get("meta_info", {}).get("completion_tokens", out.output_len))
    if out.ttft == 0.0:
        out.ttft = now - out.start_time
    else:
        new = n - int(state["tokens"])
        if new == 0:
            return
        out.itl.extend([(now - state["at"]) / new] * new)
    out.output_len = n
    state["at"], state["tokens"] = now, n


async def stream_generate(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout: float, t0: float
) -> StreamOutput:
    """POST a streamed /generate and time its chunks (times relative to t0)."""
    out = StreamOutput(start_time=time.perf_counter() - t0)
    state = {"at": out.start_time, "tokens": 0.0}
    try:
        async with session.post(
            url + "/generate", json={**body, "stream": True}, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as reply:
            if reply.status != 200:
                out.error = f"HTTP {reply.status}: {(await reply.text(errors='replace'))[:500]}"
                return out
            async for raw in reply.content:
                line = raw.strip()
                if not line:
                    continue
                now = time.perf_counter() - t0
                out.latency = now - out.start_time
                text = line.decode("utf-8", errors="replace").removeprefix("data: ")
                if text != "[DONE]":
                    _chunks_to_output(out, json.loads(text), now, state)
    except asyncio.TimeoutError:
        out.error = f"TimeoutError: no full reply within {timeout:g} s"
    except (aiohttp.ClientError, OSError, ValueError) as e:
        out.error = f"{type(e).__name__}: {e}"
    if not out.error and out.output_len == 0:
        out.error = "the stream ended without a token"
    out.success = not out.error
    return out


@dataclass
class RateRun:
    """One rate's requests, sent and answered."""

    rate: float
    seed: int
    duration_s: float  # from the first send to the last completion
    outputs: list[StreamOutput]

    def record(self) -> OpenRateRecord:
        return summarise(self.rate, self.seed, self.outputs, self.duration_s)


def run_rate(
    url: str,
    prompts: Sequence[str],
    rate: float,
    sampling: dict[str, Any],
    *,
    seed: int = 1,
    timeout: float = 600.0,
    on_done: Callable[[int, int], None] | None = None,
    settle: int = 0,
    on_measured_start: Callable[[], object] | None = None,
) -> RateRun:
    """Send each prompt at Poisson arrivals of `rate` per second (open loop: no wait on the replies).

    settle: the first this many prompts are sent and answered but not measured; the run's outputs
    and duration (from the first measured send to the last completion) are the rest's.
    on_measured_start: called (in a thread) just before the first measured prompt is sent, so that
    what the server counts from there (the switch's steps) is read over the measured requests; the
    sends after it keep their schedule.
    """
    if not 0 <= settle < len(prompts):
        raise ValueError(f"settle must leave requests to measure: {settle} of {len(prompts)}")
    run = _run_rate(url, list(prompts), rate, sampling, seed, timeout, on_done, settle, on_measured_start)
    return asyncio.run(run)


async def _run_rate(
    url: str,
    prompts: list[str],
    rate: float,
    sampling: dict[str, Any],
    seed: int,
    timeout: float,
    on_done: Callable[[int, int], None] | None,
    settle: int,
    on_measured_start: Callable[[], object] | None,
) -> RateRun:
    done = 0

    async def one(session: aiohttp.ClientSession, prompt: str, t0: float) -> StreamOutput:
        nonlocal done
        res = await stream_generate(session, url, {"text": prompt, "sampling_params": sampling}, timeout, t0)
        done += 1
        if on_done:
            on_done(done, len(prompts))
        return res

    connector = aiohttp.TCPConnector(limit=0)  # the arrivals, not a connection pool, set what is in flight
    async with aiohttp.ClientSession(connector=connector, read_bufsize=READ_BUFSIZE) as session:
        tasks = []
        t0 = time.perf_counter()
        for i, (prompt, at) in enumerate(zip(prompts, arrival_offsets(len(prompts), rate, seed), strict=True)):
            wait = at - (time.perf_counter() - t0)
            if wait > 0:
                await asyncio.sleep(wait)
            if i == settle and on_measured_start is not None:
                # At the measured send's time, not right after the last settling send: the server
                # must have taken that request in before the read, or its steps count as measured.
                await asyncio.to_thread(on_measured_start)
            tasks.append(asyncio.create_task(one(session, prompt, t0)))
        outputs = list(await asyncio.gather(*tasks))
        duration = time.perf_counter() - t0
    measured = outputs[settle:]
    return RateRun(rate, seed, duration - min(o.start_time for o in measured), measured)


def _ms(values: list[float], q: float) -> float | None:
    """The q-th percentile in ms as bench_serving takes it (numpy's linear interpolation); None: no sample."""
    return round(float(np.percentile(values, q)) * 1000, 3) if values else None


def summarise(rate: float, seed: int, outputs: Sequence[StreamOutput], duration_s: float) -> OpenRateRecord:
    """bench_serving's calculate_metrics over one rate's outputs, and the arrival rate achieved."""
    ok = [o for o in outputs if o.success]
    failed = [o.error for o in outputs if not o.success]
    tpots = [(o.latency - o.ttft) / (o.output_len - 1) for o in ok if o.output_len > 1]
    tokens = sum(o.output_len for o in ok)
    starts = sorted(o.start_time for o in outputs)
    span = starts[-1] - starts[0] if starts else 0.0
    dur = duration_s if duration_s > 0 else math.inf
    return OpenRateRecord(
        request_rate=rate,
        seed=seed,
        requests=len(outputs),
        completed=len(ok),
        errors=tuple(failed[:5]) + ((f"... {len(failed)} errors",) if len(failed) > 5 else ()),
        output_tokens=tokens,
        duration_s=round(duration_s, 3),
        output_tok_per_s=round(tokens / dur, 2),
        request_per_s=round(len(ok) / dur, 3),
        arrival_rate=round((len(starts) - 1) / span, 3) if span > 0 and math.isfinite(rate) else None,
        concurrency=round(sum(o.latency for o in ok) / dur, 2),
        ttft_p50_ms=_ms([o.ttft for o in ok], 50),
        ttft_p99_ms=_ms([o.ttft for o in ok], 99),
        tpot_p50_ms=_ms(tpots, 50),
        tpot_p99_ms=_ms(tpots, 99),
        itl_p50_ms=_ms([x for o in ok for x in o.itl], 50),
        itl_p99_ms=_ms([x for o in ok for x in o.itl], 99),
        e2e_p50_ms=_ms([o.latency for o in ok], 50),
    )
