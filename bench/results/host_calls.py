"""Where the host's CUDA calls come from, in a profile traced with Python stacks (--profile-stacks).

A wave start costs a speculating server host time that a plain one does not spend (more kernel
launches, copies and synchronisations: docs/measurements.md), and the runtime calls alone do not say
which code made them. With stacks, the trace holds each Python call as a `python_function` event on
the thread that ran it; every `cuda_runtime` event is then counted for each SGLang function it ran
under, so the functions a speculating server adds (the draft's prefill extend, its bookkeeping)
show with their launches, copies and synchronisations beside the target forward both servers run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

PYTHON_CATEGORY = "python_function"
RUNTIME_CATEGORY = "cuda_runtime"
SYNC_CALLS = frozenset({"cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize"})
# "/tmp/sgltree/python/sglang/srt/managers/scheduler.py(2346): run_batch"
_SGLANG_FRAME = re.compile(r"sglang/srt/(?P<file>[^()]+?)\(\d+\): (?P<function>.+)$")
TOP = 20
EVERYTHING = "(every host CUDA call in the window)"


@dataclass(frozen=True)
class HostCalls:
    """The CUDA runtime calls made under one SGLang function (inclusive), by kind."""

    function: str  # "managers/scheduler.py run_batch"
    launches: int
    copies: int  # cudaMemcpy* and cudaMemset*
    syncs: int  # host waits: event, stream and device synchronisations
    sync_ms: float

    @property
    def calls(self) -> int:
        return self.launches + self.copies + self.syncs


def sglang_function(frame_name: str) -> str | None:
    """The SGLang function a python_function event names ("file.py function"), None for others."""
    m = _SGLANG_FRAME.search(frame_name)
    return f"{m.group('file')} {m.group('function')}" if m else None


def _kind(call: str) -> str | None:
    if call in SYNC_CALLS:
        return "syncs"
    if call.startswith(("cudaMemcpy", "cudaMemset")):
        return "copies"
    if "Launch" in call:  # cudaLaunchKernel(ExC), cuLaunchKernel(Ex), cudaGraphLaunch
        return "launches"
    return None


class _Tally:
    def __init__(self) -> None:
        self.counts: dict[str, dict[str, float]] = {}

    def add(self, function: str, kind: str, ms: float) -> None:
        row = self.counts.setdefault(function, {"launches": 0, "copies": 0, "syncs": 0, "sync_ms": 0.0})
        row[kind] += 1
        if kind == "syncs":
            row["sync_ms"] += ms

    def rows(self) -> list[HostCalls]:
        out = [
            HostCalls(f, int(r["launches"]), int(r["copies"]), int(r["syncs"]), round(r["sync_ms"], 3))
            for f, r in self.counts.items()
        ]
        return sorted(out, key=lambda h: (-h.calls, h.function))


def by_function(events: list[dict[str, Any]], top: int = TOP) -> list[HostCalls]:
    """The whole window's calls first, then the SGLang functions with the most calls under them;
    empty when the trace holds no Python frames (traced without stacks)."""
    threads: dict[tuple[Any, Any], list[tuple[float, float, str | None, str | None]]] = {}
    for e in events:
        cat = e.get("cat")
        if cat == PYTHON_CATEGORY:
            function, kind = sglang_function(str(e.get("name", ""))), None
            if function is None:
                continue
        elif cat == RUNTIME_CATEGORY:
            function, kind = None, _kind(str(e.get("name", "")))
            if kind is None:
                continue
        else:
            continue
        ts, dur = float(e["ts"]), float(e["dur"])
        threads.setdefault((e.get("pid"), e.get("tid")), []).append((ts, ts + dur, function, kind))
    if not any(f for spans in threads.values() for _, _, f, _ in spans):
        return []
    tally = _Tally()
    for spans in threads.values():
        _sweep(spans, tally)
    rows = tally.rows()
    return [r for r in rows if r.function == EVERYTHING] + [r for r in rows if r.function != EVERYTHING][:top]


def _sweep(spans: list[tuple[float, float, str | None, str | None]], tally: _Tally) -> None:
    """Frames nest on a thread: each call counts once for every distinct function open around it."""
    open_frames: list[tuple[float, str]] = []  # (end, function), outermost first
    # At one timestamp a frame opens before the calls it holds (the longer span first).
    for start, end, function, kind in sorted(spans, key=lambda s: (s[0], -(s[1] - s[0]), s[3] is not None)):
        while open_frames and open_frames[-1][0] <= start:
            open_frames.pop()
        if function is not None:
            open_frames.append((end, function))
        elif kind is not None:
            ms = (end - start) / 1000.0
            tally.add(EVERYTHING, kind, ms)
            for f in dict.fromkeys(f for _, f in open_frames):
                tally.add(f, kind, ms)


def beyond(rows: list[HostCalls], reference: list[HostCalls], top: int = 10) -> list[HostCalls]:
    """What each function made beyond the reference profile's same function (a function the
    reference never ran counts whole): the functions with the most extra calls first."""
    ref = {r.function: r for r in reference}
    extra = []
    for r in rows:
        base = ref.get(r.function, HostCalls(r.function, 0, 0, 0, 0.0))
        d = HostCalls(
            r.function, r.launches - base.launches, r.copies - base.copies, r.syncs - base.syncs,
            round(r.sync_ms - base.sync_ms, 3),
        )  # fmt: skip
        if d.calls > 0:
            extra.append(d)
    return sorted(extra, key=lambda h: (-h.calls, h.function))[:top]
