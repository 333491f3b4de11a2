"""`python -m bench` end to end against a fake server (tests/bench/data/fake_tree): server start and
stop in its own process group, the sweep, counters from /metrics, thresholds from this run, writers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_helpers import FAKE_TREE, run_fake_bench  # noqa: E402


def test_bench_against_fake_server(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = run_fake_bench(
        out,
        "--model",
        "/fake/target",
        "--draft-model",
        "/fake/draft",
        "--configs",
        "nospec,spec,switch-v1",
        "--concurrency",
        "1,4",
        "--num-requests",
        "4",
        "--max-new-tokens",
        "8",
        "--switch-thresholds",
        "2,1",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert set(res["configs"]) == {"nospec", "spec", "switch-v1"}
    for name, c in res["configs"].items():
        assert [lv["concurrency"] for lv in c["levels"]] == [1, 4]
        assert all(lv["output_tokens"] == 8 * lv["requests"] and not lv["errors"] for lv in c["levels"]), name
        # every level's requests came in whole waves of C, each with its own rate
        assert [len(lv["wave_tok_per_s"]) for lv in c["levels"]] == [
            lv["requests"] // lv["concurrency"] for lv in c["levels"]
        ], name
        assert all(w > 0 for lv in c["levels"] for w in lv["wave_tok_per_s"]), name
        # and the span over which the client sent it (a wave of one request: none)
        assert [len(lv["wave_send_spread_s"]) for lv in c["levels"]] == [
            len(lv["wave_tok_per_s"]) for lv in c["levels"]
        ]
        assert all(s == 0 for s in c["levels"][0]["wave_send_spread_s"]), name
        assert all(s >= 0 for s in c["levels"][1]["wave_send_spread_s"]), name
        if Path("/proc/self/task").is_dir():  # each level sampled the server's process group on the host
            assert all(lv["host"] and lv["host"][0]["threads"] >= 1 for lv in c["levels"]), name
    sw = res["configs"]["switch-v1"]
    assert sw["flags"][-4:] == ["--speculative-disable-batch-size", "2", "--speculative-enable-batch-size", "1"]
    assert "--speculative-draft-model-path" not in sw["flags"]  # added by ServerSpec.argv
    assert sw["levels"][0]["counters"]["spec_steps"] == 4 and sw["levels"][1]["counters"]["fallback_steps"] > 0
    assert res["configs"]["nospec"]["levels"][0]["counters"] is None
    assert set(res["ratios"]["switch-v1"]) == {"1", "4"}
    assert (out / "results.csv").is_file() and (out / "results.md").is_file()
    assert "recommended" in p.stdout or res["recommendation"]["kind"] in ("always", "never", "crossover")
    log = (out / "logs" / "spec.log").read_text()
    assert "--speculative-draft-model-path /fake/draft" in log
    # no server left behind
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(FAKE_TREE) not in ps and "--model-path /fake/target" not in ps


def test_switch_thresholds_from_this_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = run_fake_bench(
        out,
        "--model",
        "/fake/t",
        "--draft-model",
        "/fake/d",
        "--configs",
        "switch-v1",
        "--concurrency",
        "1",
        "--num-requests",
        "1",
        "--max-new-tokens",
        "2",
    )
    assert p.returncode == 1 and "needs thresholds" in p.stderr
    assert "failed" in json.loads((out / "results.json").read_text())["configs"]["switch-v1"]


def test_server_failure_is_reported_with_log(tmp_path: Path) -> None:
    from bench.run.server import Server, ServerError, ServerSpec

    spec = ServerSpec("/m", flags=["--port-is-overridden"], env={"PYTHONPATH": "/nonexistent"})
    srv = Server(spec, tmp_path / "s.log", tmp_path)  # tree without python/sglang: import fails
    with pytest.raises(ServerError, match="exited with"):
        srv.start(timeout=60)
    assert srv.proc is None and (tmp_path / "s.log").is_file()


def test_time_budget_skips_a_config_that_could_not_finish() -> None:
    from bench.run.sweep import budget_verdict

    assert budget_verdict(None, 1000.0, [10.0]) is None
    assert budget_verdict(300.0, 100.0, []) is None  # nothing known yet: start it
    assert budget_verdict(300.0, 100.0, [150.0, 90.0]) is None
    assert "spent" in (budget_verdict(300.0, 301.0, []) or "")
    why = budget_verdict(260.0, 190.0, [166.0])  # the gpu-bound-deep run that the device limit cut off
    assert why is not None and "70s of the 260s time budget left" in why and "166s" in why


def test_repeat_serves_a_config_again_and_names_a_config_the_run_lacks(tmp_path: Path) -> None:
    base = (
        "--model",
        "/fake/t",
        "--configs",
        "nospec",
        "--concurrency",
        "1,2",
        "--num-requests",
        "2",
        "--max-new-tokens",
        "4",
    )
    p = run_fake_bench(tmp_path / "ok", *base, "--repeat", "nospec")
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((tmp_path / "ok" / "results.json").read_text())
    assert list(res["configs"]) == ["nospec", "nospec-again"]
    assert res["configs"]["nospec-again"]["flags"] == res["configs"]["nospec"]["flags"]
    assert set(res["ratios"]["nospec-again"]) == {"1", "2"}
    assert "Run-to-run noise, `nospec` served twice" in (tmp_path / "ok" / "results.md").read_text()

    p = run_fake_bench(tmp_path / "bad", *base, "--repeat", "nospec,spec")
    assert p.returncode == 2 and "--repeat spec: not one of the run's configs (nospec)" in p.stderr


def test_repeat_serves_each_config_named_again_after_every_first_run(tmp_path: Path) -> None:
    args = ("--model", "/fake/t", "--draft-model", "/fake/d", "--configs", "nospec,spec-v2", "--concurrency", "1")
    p = run_fake_bench(
        tmp_path, *args, "--num-requests", "1", "--max-new-tokens", "4", "--repeat", "spec-v2, nospec,spec-v2,"
    )
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert list(res["configs"]) == ["nospec", "spec-v2", "spec-v2-again", "nospec-again"]
    assert res["configs"]["spec-v2-again"]["compare_to"] == ["spec-v2"]
    md = (tmp_path / "results.md").read_text()
    assert "`spec-v2` served twice" in md and "`nospec` served twice" in md


def test_freeze_gc_freezes_each_server_after_its_warm_up(tmp_path: Path) -> None:
    base = (
        "--model",
        "/fake/t",
        "--configs",
        "nospec",
        "--concurrency",
        "1",
        "--num-requests",
        "2",
        "--max-new-tokens",
        "4",
        "--freeze-gc",
    )
    p = run_fake_bench(tmp_path / "ok", *base)
    assert p.returncode == 0, p.stderr[-3000:]
    log = (tmp_path / "ok" / "logs" / "nospec.log").read_text()
    # after the warm-up's requests, before the level's
    warm_up, level = log.split("freeze_gc: garbage collector frozen")
    assert "Decode batch" in warm_up and "Decode batch" in level
    assert json.loads((tmp_path / "ok" / "results.json").read_text())["meta"]["freeze_gc"] is True

    p = run_fake_bench(tmp_path / "old", *base, env={"FAKE_NO_FREEZE_GC": "1"})
    assert "this SGLang has no /freeze_gc; run without --freeze-gc" in p.stderr
    assert "failed" in json.loads((tmp_path / "old" / "results.json").read_text())["configs"]["nospec"]


@pytest.mark.parametrize("levels", [[1], [3], [10, 30, 100], [1, 2, 5, 10, 30, 70, 100, 250]])
def test_the_warm_up_reaches_every_power_of_two_bucket_of_the_levels(levels: list[int]) -> None:
    """SGLang's speculative kernels specialise on next_power_of_2(batch size): every batch size a
    level can run, from 1 to its concurrency, falls in a bucket the warm-up has run."""
    from bench.run.sweep import warm_up_levels

    def bucket(bs: int) -> int:
        return 1 << (bs - 1).bit_length()

    warm = warm_up_levels(levels)
    assert max(warm) == max(levels)
    assert {bucket(bs) for bs in range(1, max(levels) + 1)} == {bucket(c) for c in warm}


def test_each_server_is_warmed_up_at_the_powers_of_two_before_the_levels(tmp_path: Path) -> None:
    p = run_fake_bench(
        tmp_path,
        "--model",
        "/fake/t",
        "--configs",
        "nospec",
        "--concurrency",
        "3",
        "--num-requests",
        "3",
        "--waves",
        "1",
        "--max-new-tokens",
        "4",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    served = (tmp_path / "logs" / "nospec.log").read_text().count("Decode batch")
    # the readiness probe, the warm-up at 1, 2 and 3 (the level, in place of 4), then the level
    assert served == 1 + (1 + 2 + 3) + 3
