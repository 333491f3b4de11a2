"""Two profiles of one level and window side by side in time: the GPU's work, and the host's time on
the calls both made as often.

At small batches a v2 speculative step waits on its host (GPU idle a third of the window at C=2), so
its step time follows how fast that host runs as much as what it runs. On one H100 a switching
server's profile and an always-speculating one's held the same host calls and the same kernels,
and the switch's window was 7% longer: every CPU op and runtime call took longer. A line per
reference says which it is: more work (GPU busy, or the calls counted beyond the reference's) or
the same work on a slower host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.results.host_calls import SYNC_CALLS
from bench.results.profile import ProfileSummary

Ranked = Sequence[tuple[str, float, int]]  # name, ms, count: ProfileSummary's top rows


@dataclass(frozen=True)
class SameCalls:
    """The summed time of the rows both profiles hold with equal counts, this one's over the other's."""

    rows: int
    ratio: float


@dataclass(frozen=True)
class TimeRatios:
    """This profile's times over a reference's of the same level and window."""

    window: float
    gpu_busy: float
    cpu_ops: SameCalls | None  # outermost CPU ops
    runtime_calls: SameCalls | None  # CUDA runtime calls, host waits left out (they time the GPU)


def same_calls(mine: Ranked, theirs: Ranked, leave_out: frozenset[str] = frozenset()) -> SameCalls | None:
    """None when no row of one appears in the other as often (different work: no like to compare)."""
    counts = {name: (ms, n) for name, ms, n in theirs if name not in leave_out}
    pairs = [(ms, counts[name][0]) for name, ms, n in mine if name in counts and counts[name][1] == n]
    reference_ms = sum(ref for _, ref in pairs)
    if not pairs or reference_ms <= 0:
        return None
    return SameCalls(len(pairs), sum(ms for ms, _ in pairs) / reference_ms)


def compare(mine: ProfileSummary, theirs: ProfileSummary) -> TimeRatios | None:
    """The host's times only where both ran as many GPU events: the same work, as far as a profile
    tells (a plain and a speculating server's rows of equal counts are different calls)."""
    if theirs.window_ms <= 0 or theirs.gpu_busy_ms <= 0:
        return None
    same_work = mine.kernels == theirs.kernels
    return TimeRatios(
        window=mine.window_ms / theirs.window_ms,
        gpu_busy=mine.gpu_busy_ms / theirs.gpu_busy_ms,
        cpu_ops=same_calls(mine.top_cpu_ops, theirs.top_cpu_ops) if same_work else None,
        runtime_calls=(same_calls(mine.top_runtime_calls, theirs.top_runtime_calls, SYNC_CALLS) if same_work else None),
    )


def markdown(reference: str, r: TimeRatios) -> str:
    parts = [f"window {r.window:.2f}x", f"GPU busy {r.gpu_busy:.2f}x"]
    if r.cpu_ops:
        parts.append(f"CPU ops {r.cpu_ops.ratio:.2f}x ({r.cpu_ops.rows} made as often)")
    if r.runtime_calls:
        parts.append(
            f"runtime calls {r.runtime_calls.ratio:.2f}x ({r.runtime_calls.rows} made as often, syncs left out)"
        )
    return f"  - times over `{reference}`'s: " + ", ".join(parts)
