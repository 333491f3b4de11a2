"""The host's CUDA calls by the SGLang function that made them (--profile-stacks), from a trace
with Python frames as Kineto writes them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench_helpers import run_fake_bench  # noqa: E402

from bench.results.host_calls import EVERYTHING, HostCalls, by_function, sglang_function  # noqa: E402
from bench.results.profile import markdown, summarize  # noqa: E402
from bench.results.profile_records import ProfileRecord  # noqa: E402

TREE = "/tmp/sgltree/python/sglang/srt/"


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def _frame(where: str, ts: float, dur: float, tid: int = 1) -> dict:
    return _x("python_function", TREE + where, ts, dur, tid)


TRACE = [
    _frame("managers/scheduler.py(2346): run_batch", 0, 1000),
    _frame("speculative/eagle_worker_v2.py(474): _draft_extend_for_prefill", 100, 400),
    _x("python_function", "/usr/lib/python3/torch/nn/modules/module.py(1751): _call_impl", 150, 50),
    _frame("speculative/eagle_worker_v2.py(474): _draft_extend_for_prefill", 300, 100),  # nested again
    _x("cuda_runtime", "cudaLaunchKernel", 10, 5),  # under run_batch
    _x("cuda_runtime", "cudaLaunchKernel", 160, 5),  # under both, inside a torch frame
    _x("cuda_runtime", "cudaMemcpyAsync", 310, 5),  # under both, twice under the draft extend
    _x("cuda_runtime", "cudaGraphLaunch", 100, 3),  # starts where the draft extend does: under it
    _x("cuda_runtime", "cudaEventSynchronize", 900, 2000),  # under run_batch
    _x("cuda_runtime", "cudaGetDevice", 20, 1),  # not a launch, copy or wait
    _x("cuda_runtime", "cudaLaunchKernel", 1500, 5),  # under no SGLang function
    _frame("managers/scheduler.py(900): process_batch_result", 0, 5000, tid=2),  # another thread's
    _x("kernel", "gemm", 0, 400, tid=7),
]


def test_each_call_counts_once_under_every_sglang_function_open_around_it() -> None:
    rows = {h.function: h for h in by_function(TRACE)}
    assert rows[EVERYTHING] == HostCalls(EVERYTHING, 4, 1, 1, 2.0)
    assert rows["managers/scheduler.py run_batch"] == HostCalls("managers/scheduler.py run_batch", 3, 1, 1, 2.0)
    draft = "speculative/eagle_worker_v2.py _draft_extend_for_prefill"
    assert rows[draft] == HostCalls(draft, 2, 1, 0, 0.0)
    assert "managers/scheduler.py process_batch_result" not in rows, "a frame holds only its own thread's calls"
    assert list(rows)[:3] == [EVERYTHING, "managers/scheduler.py run_batch", draft], "the most calls first"


def test_frames_are_named_by_their_file_under_srt_and_their_function() -> None:
    assert sglang_function(TREE + "speculative/eagle_utils.py(20): rotate_prefill_input_ids") == (
        "speculative/eagle_utils.py rotate_prefill_input_ids"
    )
    assert sglang_function("/x/torch/nn/modules/module.py(1751): _call_impl") is None


def test_a_trace_without_python_frames_has_no_rows_and_the_summary_carries_them_through_json() -> None:
    assert by_function([e for e in TRACE if e["cat"] != "python_function"]) == []
    summary = summarize({"traceEvents": TRACE})
    assert summary.host_calls == by_function(TRACE)
    record = ProfileRecord(30, summary)
    assert ProfileRecord.from_json(json.loads(json.dumps(record.to_json())), "p") == record
    line = markdown("switch-v2", 30, summary)[-1]
    assert line.startswith("  - host CUDA calls under each SGLang function (launches/copies/syncs, sync ms): ")
    assert "managers/scheduler.py run_batch 3/1/1 (2.0)" in line
    plain = summarize({"traceEvents": [e for e in TRACE if e["cat"] != "python_function"]})
    assert "host_calls" not in ProfileRecord(30, plain).to_json()


def test_profile_stacks_asks_sglang_for_stacks_and_reports_the_calls(tmp_path: Path) -> None:
    args = ("--model", "/fake/target", "--configs", "nospec", "--concurrency", "2", "--num-requests", "2")
    for stacks in (False, True):
        out = tmp_path / f"out-{stacks}"
        flags = ("--max-new-tokens", "50", "--profile-at", "2", "--profile-window", "wave-start")
        p = run_fake_bench(out, *args, *flags, *(["--profile-stacks"] if stacks else []))
        assert p.returncode == 0, p.stderr[-3000:]
        prof = json.loads((out / "results.json").read_text())["configs"]["nospec"]["profile"]
        calls = {h["function"]: (h["launches"], h["copies"], h["syncs"]) for h in prof.get("host_calls", [])}
        if not stacks:
            assert calls == {}
            continue
        assert calls == {
            EVERYTHING: (2, 1, 1),
            "managers/scheduler.py run_batch": (2, 1, 1),
            "speculative/eagle_worker_v2.py _draft_extend_for_prefill": (1, 1, 0),
        }
        assert "_draft_extend_for_prefill 1/1/0 (0.0)" in (out / "results.md").read_text()


def test_results_md_lists_the_calls_a_config_made_beyond_nospecs_at_the_same_level() -> None:
    from bench.results.profile import ProfileSummary, ProfileWindow
    from bench.results.profile_records import section

    def record(c: int, calls: list[HostCalls], window: ProfileWindow = ProfileWindow.WAVE_START) -> ProfileRecord:
        return ProfileRecord(c, ProfileSummary(10.0, 5.0, 0.5, 3, host_calls=calls), window=window)

    run_batch, draft = "managers/scheduler.py run_batch", "speculative/eagle_worker_v2.py _draft_extend_for_prefill"
    plain = [HostCalls(EVERYTHING, 100, 10, 2, 1.0), HostCalls(run_batch, 80, 5, 1, 0.5)]
    spec = [
        HostCalls(EVERYTHING, 160, 15, 2, 1.0),
        HostCalls(run_batch, 140, 10, 1, 0.5),
        HostCalls(draft, 50, 5, 0, 0),
    ]
    lines = section(
        {"nospec": (record(30, plain),), "switch-v2": (record(30, spec), record(70, spec))},
        {"switch-v2": ["nospec"]},
    )
    beyond = [line for line in lines if "beyond" in line]
    assert beyond == [
        f"  - host calls beyond `nospec`'s (launches/copies/syncs): {EVERYTHING} +60/+5/+0, {run_batch} +60/+5/+0, "
        f"{draft} +50/+5/+0"
    ], "only at a level nospec was profiled at too"
    full_batch = section(
        {"nospec": (record(30, plain),), "x": (record(30, spec, ProfileWindow.FULL_BATCH),)}, {"x": ["nospec"]}
    )
    assert not any("beyond" in line for line in full_batch), "nor in another window"


def test_a_switch_is_also_compared_with_the_speculating_server_it_is_measured_against() -> None:
    """The switch's extra host work while it speculates is what it calls beyond spec-v2, not nospec."""
    from bench.results.profile import ProfileSummary, ProfileWindow
    from bench.results.records import ConfigRecord, RunResults
    from bench.results.report import analyse, markdown

    def profiled(calls: list[HostCalls], compare_to: tuple[str, ...] = ()) -> ConfigRecord:
        summary = ProfileSummary(10.0, 5.0, 0.5, 3, host_calls=calls)
        record = ProfileRecord(2, summary, window=ProfileWindow.FULL_BATCH)
        return ConfigRecord(flags=(), compare_to=compare_to, profiles=(record,))

    decide = "speculative/spec_switch.py decide"
    run = RunResults(
        meta={},
        configs={
            "nospec": profiled([HostCalls(EVERYTHING, 100, 10, 0, 0.0)]),
            "spec-v2": profiled([HostCalls(EVERYTHING, 300, 40, 10, 5.0)]),
            "switch-v2": profiled(
                [HostCalls(EVERYTHING, 303, 40, 12, 6.0), HostCalls(decide, 3, 0, 2, 1.0)], ("nospec", "spec-v2")
            ),
        },
    )
    beyond = [line for line in markdown(run, analyse(run)).splitlines() if "beyond" in line]
    assert beyond == [
        f"  - host calls beyond `nospec`'s (launches/copies/syncs): {EVERYTHING} +200/+30/+10",
        f"  - host calls beyond `nospec`'s (launches/copies/syncs): {EVERYTHING} +203/+30/+12, {decide} +3/+0/+2",
        f"  - host calls beyond `spec-v2`'s (launches/copies/syncs): {EVERYTHING} +3/+0/+2, {decide} +3/+0/+2",
    ]


def test_a_trace_with_stacks_is_waited_for_longer(tmp_path: Path) -> None:
    import pytest
    from bench_helpers import LocalServer

    from bench.results.profile import STACKS_WRITE_FACTOR, ProfileError, ProfileWindow, profile_level

    asked: list[bool] = []

    def answer(path: str, body: dict) -> tuple[int, bytes]:  # a server that never writes its trace
        if path == "/start_profile":
            asked.append(body["with_stack"])
        return 200, json.dumps({"text": "", "output_ids": [], "meta_info": {"completion_tokens": 0}}).encode()

    log = tmp_path / "server.log"
    log.write_text("")
    for stacks in (False, True):
        with LocalServer(answer) as srv, pytest.raises(ProfileError) as e:
            profile_level(
                srv.url, ["a"], 1, {}, out_dir=tmp_path / f"p{stacks}", log_path=log,
                window=ProfileWindow.WAVE_START, with_stack=stacks, trace_wait_s=0.4,
            )  # fmt: skip
        waited = 0.4 * (STACKS_WRITE_FACTOR if stacks else 1)  # 0 s, then 2 s
        assert f"no rank-0 trace appeared in {tmp_path / f'p{stacks}'} within {waited:.0f} s" in str(e.value)
    assert asked == [False, True]
