"""Where a step's time goes: a torch-profiler trace of a few decode steps, summarised.

`profile_level` sends a level of concurrency C, waits until the server logs a decode batch of C,
asks SGLang's `/start_profile` for `num_steps` steps of CPU and GPU activity, and summarises the
trace rank 0 writes (`*-TP-0.trace.json.gz`, Chrome trace format). With the wave-start window it
starts the profiler first, so the steps are the wave's prefill batches and its first decodes: where a
level's time goes that a full batch's steps do not show. The figure that matters for the
speculation switch is how long the GPU sits idle: a step bound by the server's CPU work (scheduling,
batch preparation, kernel launches) leaves gaps between kernels that a faster GPU cannot close.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import requests

from bench.errors import BenchError
from bench.results.host_calls import HostCalls, by_function
from bench.results.logparse import parse_log
from bench.run import client

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
CPU_CATEGORIES = {"cpu_op"}  # not python_function (--profile-stacks): its frames would nest everything
RUNTIME_CATEGORY = "cuda_runtime"  # launches, copies and synchronisations: where the CPU waits
TOP = 12
STACKS_WRITE_FACTOR = 5  # how much longer a trace with Python stacks may take to appear


class ProfileError(BenchError):
    pass


class ProfileWindow(Enum):
    FULL_BATCH = "full-batch"  # num_steps decode steps once the batch holds the whole wave
    WAVE_START = "wave-start"  # the wave's first num_steps forward passes: prefill batches, first decodes


@dataclass(frozen=True)
class ProfileSummary:
    window_ms: float  # from the first to the last event of the trace
    gpu_busy_ms: float  # union of kernel, memcpy and memset intervals
    gpu_idle_fraction: float
    kernels: int
    top_cpu_ops: list[tuple[str, float, int]] = field(default_factory=list)  # outermost ops: name, ms, count
    top_kernels: list[tuple[str, float, int]] = field(default_factory=list)  # name, ms, count
    top_runtime_calls: list[tuple[str, float, int]] = field(default_factory=list)  # name, ms, count
    note: str = ""
    host_calls: list[HostCalls] = field(default_factory=list)  # by SGLang function (--profile-stacks)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_trace(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    data = json.loads(text)
    return data if isinstance(data, dict) else {"traceEvents": data}


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total / 1000.0


def _ranked(totals: dict[str, list[float]]) -> list[tuple[str, float, int]]:
    rows = [(name, round(sum(d) / 1000.0, 3), len(d)) for name, d in totals.items()]
    return sorted(rows, key=lambda r: -r[1])[:TOP]


def summarize(trace: dict[str, Any], note: str = "") -> ProfileSummary:
    """GPU busy and idle time over the trace's window, and where the CPU and GPU time went.

    CPU ops are counted at their outermost level per thread, so nested ops are not counted twice.
    """
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and "ts" in e]
    if not events:
        raise ProfileError("the trace holds no complete events")
    start = min(float(e["ts"]) for e in events)
    stop = max(float(e["ts"]) + float(e["dur"]) for e in events)
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    busy = _union_ms([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in gpu])
    window = (stop - start) / 1000.0
    kernels: dict[str, list[float]] = {}
    for e in gpu:
        kernels.setdefault(e.get("name", "?"), []).append(float(e["dur"]))
    runtime: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == RUNTIME_CATEGORY:
            runtime.setdefault(e.get("name", "?"), []).append(float(e["dur"]))
    outer: dict[str, list[float]] = {}
    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in events:
        if e.get("cat") in CPU_CATEGORIES:
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for ops in by_thread.values():
        covered_until = float("-inf")
        for e in sorted(ops, key=lambda e: (float(e["ts"]), -float(e["dur"]))):
            if float(e["ts"]) >= covered_until:
                outer.setdefault(e.get("name", "?"), []).append(float(e["dur"]))
                covered_until = float(e["ts"]) + float(e["dur"])
    return ProfileSummary(
        window_ms=round(window, 3),
        gpu_busy_ms=round(busy, 3),
        gpu_idle_fraction=round(1.0 - busy / window, 4) if window > 0 else 0.0,
        kernels=len(gpu),
        top_cpu_ops=_ranked(outer),
        top_kernels=_ranked(kernels),
        top_runtime_calls=_ranked(runtime),
        note=note,
        host_calls=by_function(events),
    )


def _decode_seen(log_path: Path, offset: int, batch_size: int) -> bool:
    """Whether the log, from byte `offset` on, holds a decode line of `batch_size`."""
    with log_path.open("rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", errors="replace")
    return any(d.batch_size == batch_size for rl in parse_log(text).values() for d in rl.decode)


def _wait_for_full_batch(level: threading.Thread, log_path: Path, offset: int, concurrency: int, wait_s: float) -> str:
    """Until the log shows a decode batch of `concurrency`; a note when it did not in wait_s."""
    deadline = time.monotonic() + wait_s
    while not _decode_seen(log_path, offset, concurrency):
        if not level.is_alive():
            # Started now, the profiler would wait for steps that never come.
            raise ProfileError(
                f"the wave ended before the server logged a decode batch of {concurrency}; "
                "send more tokens (--max-new-tokens)"
            )
        if time.monotonic() > deadline:
            return f"no decode batch of {concurrency} logged within {wait_s:.0f} s; profiled whatever ran"
        time.sleep(0.2)
    return ""


def _start_profiler(url: str, out_dir: Path, num_steps: int, with_stack: bool) -> None:
    body: dict[str, Any] = {
        "output_dir": str(out_dir),
        "num_steps": num_steps,
        "activities": ["CPU", "GPU"],
        "with_stack": with_stack,
        "record_shapes": False,
    }
    try:
        r = requests.post(url + "/start_profile", json=body, timeout=60)
    except requests.RequestException as e:
        raise ProfileError(f"/start_profile failed: {e}") from e
    if r.status_code != 200:
        raise ProfileError(f"/start_profile answered HTTP {r.status_code}: {r.text[:300]}")


def profile_level(
    url: str,
    prompts: list[str],
    concurrency: int,
    sampling: dict[str, Any],
    *,
    out_dir: Path,
    log_path: Path,
    num_steps: int = 40,
    window: ProfileWindow = ProfileWindow.FULL_BATCH,
    with_stack: bool = False,
    wait_s: float = 120.0,
    trace_wait_s: float = 60.0,
) -> ProfileSummary:
    """Profile `num_steps` steps of a level of `concurrency`: at its full batch, or from its start."""
    out_dir.mkdir(parents=True, exist_ok=True)
    before = set(out_dir.glob("*.trace.json*"))
    offset = log_path.stat().st_size if log_path.exists() else 0
    level = threading.Thread(target=client.run_level, args=(url, prompts, concurrency, sampling), daemon=True)
    note = ""
    if window is ProfileWindow.WAVE_START:
        _start_profiler(url, out_dir, num_steps, with_stack)  # the server is idle: its next steps are this wave's
        level.start()
    else:
        level.start()
        note = _wait_for_full_batch(level, log_path, offset, concurrency, wait_s)
        _start_profiler(url, out_dir, num_steps, with_stack)
    level.join()
    # A trace with Python stacks holds an event per Python call, and takes longer to write.
    wait = trace_wait_s * (STACKS_WRITE_FACTOR if with_stack else 1)
    deadline = time.monotonic() + wait
    while True:
        new = sorted(p for p in set(out_dir.glob("*TP-0*.trace.json*")) - before)
        if new:
            return summarize(load_trace(new[-1]), note)
        if time.monotonic() > deadline:
            raise ProfileError(
                f"no rank-0 trace appeared in {out_dir} within {wait:.0f} s "
                f"(num_steps={num_steps}: the level may have ended first; send more tokens)"
            )
        time.sleep(0.5)


def markdown(
    name: str, concurrency: int, p: ProfileSummary, window: ProfileWindow = ProfileWindow.FULL_BATCH
) -> list[str]:
    where = f"C={concurrency}" + (", the wave's first steps" if window is ProfileWindow.WAVE_START else "")
    lines = [
        f"- `{name}` at {where}: GPU idle **{100 * p.gpu_idle_fraction:.0f}%** of "
        f"{p.window_ms:.1f} ms ({p.kernels} GPU events)" + (f"; {p.note}" if p.note else "")
    ]
    cpu = ", ".join(f"{n} {ms:.1f} ms x{c}" for n, ms, c in p.top_cpu_ops[:5])
    gpu = ", ".join(f"{n[:60]} {ms:.1f} ms x{c}" for n, ms, c in p.top_kernels[:3])
    runtime = ", ".join(f"{n} {ms:.1f} ms x{c}" for n, ms, c in p.top_runtime_calls[:4])
    if cpu:
        lines.append(f"  - outermost CPU ops: {cpu}")
    if runtime:
        lines.append(f"  - CUDA runtime calls: {runtime}")
    if gpu:
        lines.append(f"  - kernels: {gpu}")
    if p.host_calls:
        lines.append(
            "  - host CUDA calls under each SGLang function (launches/copies/syncs, sync ms): "
            + ", ".join(f"{h.function} {h.launches}/{h.copies}/{h.syncs} ({h.sync_ms:.1f})" for h in p.host_calls[:10])
        )
    return lines
