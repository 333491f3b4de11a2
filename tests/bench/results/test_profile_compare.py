"""Two profiles of one level side by side in time: more work, or the same work on a slower host."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.results.profile import ProfileSummary, ProfileWindow  # noqa: E402
from bench.results.profile_compare import SameCalls, compare, same_calls  # noqa: E402
from bench.results.profile_records import ProfileRecord, section  # noqa: E402


def _summary(window_ms: float, busy_ms: float, ops: list, calls: list, kernels: int = 6736) -> ProfileSummary:
    return ProfileSummary(
        window_ms, busy_ms, 1 - busy_ms / window_ms, kernels, top_cpu_ops=ops, top_runtime_calls=calls
    )


# GPU 25 (one H100, trained-gpu-bound, C=2, 12 steps with stacks): spec-v2's and switch-v2-auto's rows.
SPEC = _summary(
    113.894,
    74.549,
    [("aten::copy_", 4.06, 396), ("aten::to", 2.72, 126), ("aten::slice", 1.898, 596)],
    [("cudaEventSynchronize", 36.85, 35), ("cudaGraphLaunch", 7.59, 33), ("cudaLaunchKernel", 4.241, 594)],
)
SWITCH = _summary(
    122.1,
    74.549,
    [("aten::copy_", 5.2, 396), ("aten::to", 3.1, 126), ("aten::slice", 2.6, 596)],
    [("cudaEventSynchronize", 28.1, 35), ("cudaGraphLaunch", 8.8, 33), ("cudaLaunchKernel", 4.8, 594)],
)


def test_the_same_work_on_a_slower_host_shows_as_host_time_with_the_gpus_unchanged() -> None:
    r = compare(SWITCH, SPEC)
    assert r is not None
    assert r.window == pytest.approx(122.1 / 113.894)
    assert r.gpu_busy == pytest.approx(1.0)
    assert r.cpu_ops is not None and r.cpu_ops.rows == 3
    assert r.cpu_ops.ratio == pytest.approx((5.2 + 3.1 + 2.6) / (4.06 + 2.72 + 1.898))
    # The host waits time the GPU, not the host: the switch waited less and ran slower.
    assert r.runtime_calls is not None and r.runtime_calls.rows == 2
    assert r.runtime_calls.ratio == pytest.approx((8.8 + 4.8) / (7.59 + 4.241))


def test_the_hosts_times_are_compared_only_where_the_gpu_ran_as_many_events() -> None:
    """A plain server's aten::to x252 is not a speculating server's aten::to x252."""
    other_work = _summary(122.1, 80.0, SWITCH.top_cpu_ops, SWITCH.top_runtime_calls, kernels=7000)
    r = compare(other_work, SPEC)
    assert r is not None and r.gpu_busy == pytest.approx(80.0 / 74.549)
    assert r.cpu_ops is None and r.runtime_calls is None


def test_only_rows_made_as_often_are_compared() -> None:
    mine = [("a", 2.0, 10), ("b", 100.0, 20), ("c", 3.0, 5)]
    theirs = [("a", 1.0, 10), ("b", 1.0, 10), ("d", 9.0, 5)]
    assert same_calls(mine, theirs) == SameCalls(1, 2.0), "b ran twice as often, c and d once each side"
    assert same_calls([("b", 1.0, 1)], theirs) is None, "no like to compare"


def test_results_md_gives_the_times_against_each_reference_at_the_same_level_and_window() -> None:
    def record(c: int, s: ProfileSummary, window: ProfileWindow = ProfileWindow.FULL_BATCH) -> ProfileRecord:
        return ProfileRecord(c, s, window=window)

    lines = section(
        {
            "spec-v2": (record(2, SPEC), record(5, SPEC)),
            "switch-v2-auto": (record(2, SWITCH), record(10, SWITCH), record(5, SWITCH, ProfileWindow.WAVE_START)),
        },
        {"switch-v2-auto": ["nospec", "spec-v2"]},
    )
    times = [line for line in lines if "times over" in line]
    assert times == [
        "  - times over `spec-v2`'s: window 1.07x, GPU busy 1.00x, CPU ops 1.26x (3 made as often), "
        "runtime calls 1.15x (2 made as often, syncs left out)"
    ], "at C=2 only: not at a level or window spec-v2 was not profiled at, nor against nospec (no profile)"
