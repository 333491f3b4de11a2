"""The open loop's command line (--request-rates, --rate-duration, --rate-settle, --seed) and a run
of it end to end against the fake server of tests/bench/data/fake_tree (CPU)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_helpers import run_fake_bench  # noqa: E402

from bench import cli  # noqa: E402
from bench.errors import BenchUsageError  # noqa: E402
from bench.run.arguments import parse  # noqa: E402
from bench.run.settings import RunSettings  # noqa: E402


def settings(*argv: str) -> RunSettings:
    return RunSettings.from_args(parse(list(argv)))


def test_rates_alone_run_no_levels_and_with_concurrency_both() -> None:
    s = settings("--request-rates", "2, 4.5,inf")
    assert s.request_rates == (2.0, 4.5, math.inf) and s.levels == ()
    assert s.seed == 1 and s.requests_for_rate(2.0) == 100 and s.warm_up_top == 100
    both = settings("--request-rates", "8", "--concurrency", "1,10", "--num-requests", "40", "--seed", "7")
    assert both.levels == (1, 10) and both.request_rates == (8.0,) and both.requests_for_rate(8.0) == 40
    assert both.seed == 7 and both.warm_up_top == 10
    timed = settings("--request-rates", "2,16", "--rate-duration", "10.5")
    assert [timed.requests_for_rate(r) for r in (2.0, 3.0, 16.0, 0.01)] == [21, 32, 168, 1]
    assert timed.warm_up_top == 168
    settled = settings("--request-rates", "2,16", "--rate-duration", "10", "--rate-settle", "2.5")
    assert [settled.settling_requests(r) for r in (2.0, 16.0)] == [5, 40] and settled.requests_for_rate(2.0) == 20
    assert timed.settling_requests(16.0) == 0
    assert settings("--quick").levels and settings().request_rates == ()


@pytest.mark.parametrize("text", ["2,x", "0", "-1", "2,,4", "nan"])
def test_a_bad_rate_is_refused_naming_the_flag(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:  # parsed only: a broken check must not start a sweep
        cli.parser().parse_args(cli.with_command(["--request-rates", text]))
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--request-rates" in err and "e.g. --request-rates 2,4,8,16,32" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seed", "3"], "--seed sets the open loop's arrivals: give --request-rates too"),
        (["--rate-duration", "5"], "--rate-duration sets the open loop's arrivals: give --request-rates too"),
        (
            ["--request-rates", "2", "--rate-duration", "5", "--num-requests", "9"],
            "--rate-duration and --num-requests both set the requests per rate",
        ),
        (["--request-rates", "2,inf", "--rate-duration", "5"], "--rate-duration needs finite --request-rates"),
        (["--rate-settle", "5"], "--rate-settle sets the open loop's arrivals: give --request-rates too"),
        (["--request-rates", "2,inf", "--rate-settle", "1"], "--rate-settle needs finite --request-rates"),
    ],
)
def test_options_that_do_not_go_together_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(BenchUsageError, match=message):
        settings(*argv)
    assert cli.main(argv) == 2 and f"bench: usage: {message}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["run", "--request-rates", "2", "--rate-duration", "0"])


def test_open_loop_against_fake_server(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = run_fake_bench(
        out,
        "--model",
        "/fake/target",
        "--draft-model",
        "/fake/draft",
        "--configs",
        "nospec,switch-v1",
        "--request-rates",
        "40,inf",
        "--num-requests",
        "6",
        "--max-new-tokens",
        "8",
        "--switch-thresholds",
        "2,1",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    for name, c in res["configs"].items():
        assert c["levels"] == [], name
        assert [r["request_rate"] for r in c["rates"]] == [40.0, "inf"], name
        assert all(r["completed"] == 6 and r["output_tokens"] == 48 and not r["errors"] for r in c["rates"]), name
        assert all(r["tpot_p50_ms"] > 0 and r["ttft_p50_ms"] > 0 for r in c["rates"]), name
    assert res["meta"]["request_rates"] == "40,inf" and res["meta"]["seed"] == 1
    assert "rate_settle" not in res["meta"]
    md = (out / "results.md").read_text()
    assert "| config | 40/s | inf/s |" in md and "| switch-v1 / max(nospec) |" in md
    assert "| switch-v1 / min(nospec) |" in md


def test_a_settled_rate_measures_only_the_requests_after_the_settling_ones(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ("--model", "/fake/target", "--configs", "nospec", "--request-rates", "20", "--rate-duration", "0.3")
    p = run_fake_bench(out, *argv, "--rate-settle", "0.2", "--max-new-tokens", "8")
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    (rate,) = res["configs"]["nospec"]["rates"]
    assert rate["requests"] == rate["completed"] == 6 and rate["output_tokens"] == 48  # ceil(20 x 0.3)
    assert res["meta"]["rate_settle"] == "0.2 s"
    assert "Each rate's first 0.2 s of arrivals were sent and not measured" in (out / "results.md").read_text()


def test_a_switchs_steps_are_counted_over_the_measured_requests_only(tmp_path: Path) -> None:
    """The fake server counts one switch step per request it is sent: the settling requests' steps
    are counted before the first measured send, so the rate's counters hold the measured ones'.

    At 5/s the seeded arrivals put 72 ms between the last settling send and the first measured one
    (at 20/s the last two settling sends came together, 18 ms before it, and a loaded machine's
    server took them in after the read)."""
    out = tmp_path / "out"
    argv = ("--model", "/fake/target", "--draft-model", "/fake/draft", "--configs", "nospec,switch-v1")
    flags = ("--switch-thresholds", "2,1", "--request-rates", "5", "--rate-duration", "1.1", "--rate-settle", "0.7")
    p = run_fake_bench(out, *argv, *flags, "--max-new-tokens", "8")
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    (rate,) = res["configs"]["switch-v1"]["rates"]
    steps = rate["counters"]["spec_steps"] + rate["counters"]["fallback_steps"]
    assert rate["requests"] == 6 and steps == 6, rate["counters"]  # 4 settling ones sent first
    assert "counters" not in res["configs"]["nospec"]["rates"][0]
    assert "| switch-v1 | " in (out / "results.md").read_text().split("Switch configs:")[1]
