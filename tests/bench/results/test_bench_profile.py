"""The profile summary: GPU idle time, outermost CPU ops, kernels; and the bench's profile pass (CPU)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench_helpers import run_fake_bench  # noqa: E402

from bench.results.profile import ProfileError, load_trace, summarize  # noqa: E402
from bench.results.records import read_results  # noqa: E402

# One config, one short level, against the fake server; each test adds its --profile-* flags.
PROFILED_NOSPEC = (
    "--model",
    "/fake/target",
    "--configs",
    "nospec",
    "--concurrency",
    "2",
    "--num-requests",
    "2",
    "--max-new-tokens",
    "50",
)


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def test_idle_time_is_the_window_less_the_union_of_gpu_events() -> None:
    trace = {
        "traceEvents": [
            _x("cpu_op", "launch", 0, 1000),
            _x("kernel", "a", 1000, 2000, tid=7),
            _x("kernel", "b", 2000, 2000, tid=7),  # overlaps a by 1 ms: 3 ms busy, not 4
            _x("gpu_memcpy", "Memcpy DtoH", 8000, 1000, tid=8),
            _x("cpu_op", "sync", 9000, 1000),
            {"ph": "i", "name": "instant", "ts": 50000},  # not a complete event: ignored
        ]
    }
    s = summarize(trace)
    assert (s.window_ms, s.gpu_busy_ms, s.kernels) == (10.0, 4.0, 3)
    assert s.gpu_idle_fraction == pytest.approx(0.6)


def test_cpu_ops_count_at_their_outermost_level_per_thread() -> None:
    trace = {
        "traceEvents": [
            _x("cpu_op", "prepare", 0, 5000),
            _x("cpu_op", "aten::index", 1000, 1000),  # inside prepare
            _x("cpu_op", "aten::index", 6000, 1000),
            _x("cpu_op", "aten::index", 500, 300, tid=2),  # another thread: outermost there
            _x("kernel", "k", 0, 10, tid=7),
        ]
    }
    ops = {name: (ms, n) for name, ms, n in summarize(trace).top_cpu_ops}
    assert ops == {"prepare": (5.0, 1), "aten::index": (1.3, 2)}


def test_runtime_calls_are_ranked_apart_from_the_ops_that_make_them() -> None:
    trace = {
        "traceEvents": [
            _x("cpu_op", "aten::item", 0, 3000),
            _x("cuda_runtime", "cudaStreamSynchronize", 100, 2800),  # the CPU waiting inside .item()
            _x("cuda_runtime", "cudaLaunchKernel", 5000, 10),
            _x("python_function", "scheduler.py(100): event_loop", 0, 9000),  # not a CPU op: ignored
            _x("kernel", "k", 0, 10, tid=7),
        ]
    }
    s = summarize(trace)
    assert s.top_runtime_calls == [("cudaStreamSynchronize", 2.8, 1), ("cudaLaunchKernel", 0.01, 1)]
    assert s.top_cpu_ops == [("aten::item", 3.0, 1)]


def test_traces_load_gzipped_plain_or_as_a_bare_list(tmp_path: Path) -> None:
    events = [_x("kernel", "k", 0, 1000)]
    (tmp_path / "a.trace.json.gz").write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    (tmp_path / "b.trace.json").write_text(json.dumps(events))
    for name in ("a.trace.json.gz", "b.trace.json"):
        assert summarize(load_trace(tmp_path / name)).gpu_busy_ms == 1.0


def test_an_empty_trace_is_an_error() -> None:
    with pytest.raises(ProfileError, match="no complete events"):
        summarize({"traceEvents": []})


@pytest.mark.parametrize("window,where", [("full-batch", "C=4"), ("wave-start", "C=4, the wave's first steps")])
def test_bench_profiles_each_config_and_drops_the_traces(tmp_path: Path, window: str, where: str) -> None:
    out = tmp_path / "out"
    p = run_fake_bench(out, *PROFILED_NOSPEC, "--profile-at", "4", "--profile-window", window)
    assert p.returncode == 0, p.stderr[-3000:]
    prof = json.loads((out / "results.json").read_text())["configs"]["nospec"]["profile"]
    assert prof["concurrency"] == 4 and prof["gpu_idle_fraction"] == pytest.approx(0.7), prof
    assert prof.get("profiled_steps", "full-batch") == window
    assert prof["top_cpu_ops"][0] == ["aten::index", 5.0, 2] and prof["note"] == ""
    assert not list((out / "profiles").rglob("*.trace.json*"))
    assert f"`nospec` at {where}: GPU idle **70%**" in (out / "results.md").read_text()


def test_bench_profiles_each_level_asked_for_in_order(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = run_fake_bench(out, *PROFILED_NOSPEC, "--profile-at", "4,2", "--profile-window", "wave-start")
    assert p.returncode == 0, p.stderr[-3000:]
    profiles = json.loads((out / "results.json").read_text())["configs"]["nospec"]["profile"]
    assert [prof["concurrency"] for prof in profiles] == [4, 2]
    md = (out / "results.md").read_text()
    assert md.index("`nospec` at C=4, the wave's first steps") < md.index("`nospec` at C=2, the wave's first steps")
    run, _ = read_results(out / "results.json")
    assert [prof.concurrency for prof in run.configs["nospec"].profiles] == [4, 2]


def _recording_server(posted: list[str]) -> Any:
    """A server that answers /generate with nothing and, for /start_profile, writes a rank-0 trace
    into the output_dir it is given; posted keeps the order of the requests."""
    from bench_helpers import LocalServer

    def answer(path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        posted.append(path)
        if path == "/start_profile":
            trace = {"traceEvents": [_x("kernel", "k", 0, 1000, tid=7), _x("cpu_op", "op", 0, 2000)]}
            (Path(body["output_dir"]) / "x-TP-0.trace.json").write_text(json.dumps(trace))
        return 200, json.dumps({"text": "", "output_ids": [], "meta_info": {"completion_tokens": 0}}).encode()

    return LocalServer(answer)


def test_a_wave_too_short_to_reach_a_full_decode_batch_is_not_profiled(tmp_path: Path) -> None:
    from bench.results.profile import profile_level

    log = tmp_path / "server.log"
    log.write_text("")  # this server never logs a decode batch
    posted: list[str] = []
    with _recording_server(posted) as srv:
        with pytest.raises(ProfileError, match="wave ended before"):
            profile_level(srv.url, ["a", "b"], 2, {}, out_dir=tmp_path / "p", log_path=log)
    assert posted == ["/generate", "/generate"], "the profiler must not be started"


def test_the_wave_start_window_starts_the_profiler_before_the_wave(tmp_path: Path) -> None:
    from bench.results.profile import ProfileWindow, profile_level

    log = tmp_path / "server.log"
    log.write_text("")  # no decode batch needed: nothing waits for one
    posted: list[str] = []
    with _recording_server(posted) as srv:
        summary = profile_level(
            srv.url, ["a", "b"], 2, {}, out_dir=tmp_path / "p", log_path=log, window=ProfileWindow.WAVE_START
        )
    assert posted == ["/start_profile", "/generate", "/generate"]
    assert (summary.window_ms, summary.gpu_busy_ms, summary.note) == (2.0, 1.0, "")
