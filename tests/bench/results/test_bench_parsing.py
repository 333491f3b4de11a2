"""Log and /metrics parsers, config selection, prompt loading, CLI plumbing (CPU, fast)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench_helpers import DATA  # noqa: E402

from bench import cli  # noqa: E402
from bench.configs import CONFIGS, parse_configs  # noqa: E402
from bench.results import logparse  # noqa: E402
from bench.results.decode_rate import decode_rates_by_batch_size  # noqa: E402
from bench.results.logparse import Counters, parse_log, parse_metrics, parse_threshold, rank_of  # noqa: E402
from bench.run import (
    arguments,  # noqa: E402
    client,  # noqa: E402
)
from bench.run import settings as run_settings  # noqa: E402
from bench.run.server import (  # noqa: E402
    ServerSpec,
    TreeError,
    check_tree,
    ephemeral_range,
    free_port,
    server_port_range,
    tree_has_switch,
)

LOG = """\
[2026-11-29 10:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 12, cuda graph: False
[2026-11-29 10:00:01 TP0] Decode batch, #running-req: 4, #token: 100, token usage: 0.00, accept len: 3.90, cuda graph: True, gen throughput (token/s): 700.00, #queue-req: 0, spec-switch: on=True spec_steps=10 fallback_steps=0 switches=0
[2026-11-29 10:00:01 TP1] spec-switch: speculation OFF at bs=12
[2026-11-29 10:00:01 TP0] spec-switch: speculation OFF at bs=12
[2026-11-29 10:00:02 TP0] Decode batch, #running-req: 12, #token: 300, token usage: 0.01, cuda graph: True, gen throughput (token/s): 900.00, #queue-req: 0
[2026-11-29 10:00:02 TP0] Decode batch, #running-req: 30, #token: 900, token usage: 0.02, cuda graph: False, gen throughput (token/s): 2000.00, #queue-req: 0
[2026-11-29 10:00:03 TP0] spec-switch: on=False spec_steps=10 fallback_steps=25 switches=1
[2026-11-29 10:00:03 TP1] spec-switch: on=False spec_steps=10 fallback_steps=25 switches=1
[2026-11-29 10:00:04 TP0] spec-switch: speculation ON at bs=3
[2026-11-29 10:00:04 TP0] Decode batch, #running-req: 3, #token: 50, token usage: 0.00, cuda graph: True, spec steps: 12, fallback steps: 30, switches: 2
"""

METRICS = """\
# HELP sglang:spec_switch_spec_steps_total Speculative decode steps
# TYPE sglang:spec_switch_spec_steps_total counter
sglang:spec_switch_spec_steps_total{model_name="m",tp_rank="0"} 120.0
sglang:spec_switch_spec_steps_created{model_name="m"} 1.7e9
sglang:spec_switch_fallback_steps_total{model_name="m",tp_rank="0"} 55.0
sglang:spec_switch_switches_total{model_name="m",tp_rank="0"} 4.0
sglang:num_running_reqs{model_name="m"} 3.0
"""


def test_rank_of() -> None:
    assert rank_of("[2026-11-29 10:00:01 TP1] x") == 1
    assert rank_of("[2026-11-29 10:00:01 DP0 TP3] x") == 3
    assert rank_of("[2026-11-29 10:00:01] x") == 0


def test_parse_log() -> None:
    ranks = parse_log(LOG)
    assert set(ranks) == {0, 1}
    r0, r1 = ranks[0], ranks[1]
    assert r0.events == [("OFF", 12), ("ON", 3)] and r1.events == [("OFF", 12)]
    assert r0.counters is not None and r0.counters.as_dict() == {"spec_steps": 12, "fallback_steps": 30, "switches": 2}
    assert r1.counters is not None and r1.counters.switches == 1
    states = [(d.batch_size, d.spec_on, d.cuda_graph) for d in r0.decode]
    assert states == [(4, True, True), (12, False, True), (30, False, False), (3, True, True)]
    assert [d.accept_len for d in r0.decode] == [3.90, None, None, None]
    # the switch's counters as each decode line prints them, in either format
    assert [d.counters for d in r0.decode] == [Counters(10, 0, 0), None, None, Counters(12, 30, 2)]


def test_parse_metrics() -> None:
    c = parse_metrics(METRICS)
    assert c is not None and c.as_dict() == {"spec_steps": 120, "fallback_steps": 55, "switches": 4}
    assert parse_metrics("sglang:num_running_reqs 3\n") is None
    assert parse_metrics("") is None
    # A page cut short: the samples before the break still count.
    cut = METRICS + 'sglang:spec_switch_switches_total{tp_rank="0"'
    assert parse_metrics(cut) == c


def test_parse_configs_orders_baselines_first() -> None:
    assert [c.name for c in parse_configs("switch-v1,nospec,spec")] == ["nospec", "spec", "switch-v1"]
    with pytest.raises(ValueError, match="unknown config"):
        parse_configs("nospec,bogus")
    assert CONFIGS["switch-v2"].env == {"SGLANG_ENABLE_SPEC_V2": "1"}
    assert "--speculative-eagle-topk" in CONFIGS["spec"].flags


def test_prompts() -> None:
    prompts = client.load_prompts()
    assert len(prompts) >= 30 and all(isinstance(p, str) and p for p in prompts)
    batch = client.prompts_for_level(prompts, len(prompts) + 3)
    assert len(set(batch)) == len(batch)  # repeats are made distinct


def test_server_argv() -> None:
    spec = ServerSpec("/m", "/d", 2, ["--speculative-algorithm", "EAGLE3"])
    argv = spec.argv(1234, "py")
    assert argv[:3] == ["py", "-m", "sglang.launch_server"]
    assert argv[argv.index("--tp") + 1] == "2" and argv[argv.index("--port") + 1] == "1234"
    assert argv[argv.index("--speculative-draft-model-path") + 1] == "/d"
    assert "--speculative-draft-model-path" not in ServerSpec("/m", "/d").argv(1, "py")


def _tree(tmp_path: Path, patched: bool, sm120: bool = False) -> Path:
    pkg = tmp_path / "python" / "sglang" / "srt"
    (pkg / "layers").mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "server_args.py").write_text("speculative_disable_batch_size = None\n" if patched else "x = 1\n")
    (pkg / "layers" / "communicator.py").write_text("_is_sm120_supported = False\n" if sm120 else "x = 1\n")
    return tmp_path


def test_check_tree(tmp_path: Path) -> None:
    with pytest.raises(TreeError, match="lacks the patch"):
        check_tree(_tree(tmp_path / "a", patched=False))
    tree = _tree(tmp_path / "b", patched=True)
    assert Path(check_tree(tree)).resolve() == (tree / "python" / "sglang" / "__init__.py").resolve()


def test_a_line_without_the_switch_passes_only_where_asked(tmp_path: Path) -> None:
    line_tree = _tree(tmp_path / "line", patched=False, sm120=True)
    assert not tree_has_switch(line_tree)
    with pytest.raises(TreeError, match="lacks the patch"):
        check_tree(line_tree)
    assert Path(check_tree(line_tree, require_switch=False)).name == "__init__.py"
    with pytest.raises(TreeError, match="neither the switch nor the SM120 patch"):
        check_tree(_tree(tmp_path / "bare", patched=False), require_switch=False)


def test_free_ports_leave_room_for_the_grpc_port() -> None:
    ports = [free_port() for _ in range(100)]
    assert max(ports) + 10000 <= 65535, max(ports)
    assert len(set(ports)) > 50  # drawn, not one fixed port that another server could hold


def test_server_ports_stay_below_the_ephemeral_range() -> None:
    low, high = server_port_range((32768, 60999))
    assert high + 1000 < 32768 and high - low >= 1000
    ephemeral = ephemeral_range()
    if ephemeral is not None:
        assert all(p + 1000 < ephemeral[0] for p in (free_port() for _ in range(100)))


def test_a_low_or_unreadable_ephemeral_range_keeps_the_whole_range(tmp_path: Path) -> None:
    assert server_port_range((1024, 65535)) == server_port_range(None) == (20000, 65535 - 10000)
    (tmp_path / "range").write_text("32768\t60999\n")
    assert ephemeral_range(tmp_path / "range") == (32768, 60999)
    assert ephemeral_range(tmp_path / "missing") is None


def test_cli_report_merges(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench_helpers import user_results

    from bench.results.records import RunResults

    res = user_results()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "results.json").write_text(
        json.dumps(RunResults({}, {"nospec": res.configs["nospec"]}).to_json())
    )
    (tmp_path / "b.json").write_text(json.dumps(RunResults({}, {"spec": res.configs["spec"]}).to_json()))
    assert cli.main(["report", str(tmp_path / "a"), str(tmp_path / "b.json"), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "speculation never pays" in out
    assert (tmp_path / "o" / "results.md").is_file() and (tmp_path / "o" / "results.csv").is_file()
    assert cli.main(["report", str(tmp_path / "missing")]) == 2


def test_cli_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--concurrency", "0,1"])
    assert cli.main(["--configs", "bogus", "--tree", "/nonexistent"]) == 2
    assert "bench: usage: unknown config" in capsys.readouterr().err


def test_a_run_that_cannot_go_on_is_not_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--configs", "nospec", "--tree", "/nonexistent"]) == 1
    assert "bench: error: " in capsys.readouterr().err


def test_no_overlap_baseline_disables_the_overlap_scheduler() -> None:
    cfg = parse_configs("nospec-nooverlap")[0]
    assert cfg.flags == ["--disable-overlap-schedule"]
    assert not cfg.speculative and not cfg.switch


def test_captured_graph_sets_from_a_real_switch_server_log() -> None:
    from bench.results.logparse import captured_graph_sets

    text = (DATA / "switch-v1-capture.log").read_text()
    sets = captured_graph_sets(text)
    assert [(g.kind, g.sizes[0], g.sizes[-1], g.seconds, g.gigabytes) for g in sets] == [
        ("target", 1, 64, 44.17, 0.19),
        ("plain-decode", 5, 64, 2.0, 0.07),
    ]
    # The draft's graph lines are not the target's.
    assert captured_graph_sets(text, rank=1) == []


def test_each_level_spans_several_waves() -> None:
    assert run_settings.requests_for_level(30, 3, 1) == 30  # low concurrency: the user's request count
    assert run_settings.requests_for_level(30, 3, 100) == 300  # high: three waves, not one
    assert run_settings.requests_for_level(30, 1, 250) == 250


def test_waves_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--waves", "0"])
    assert "--waves" in capsys.readouterr().err


def test_steady_decode_rates_leave_out_prefill_and_size_changes() -> None:
    """A real excerpt of a no-spec server's log (H200, gpu-bound fixture): C=10 then C=30."""
    text = (DATA / "nospec-decode.log").read_text()
    rates = {bs: list(r.rates) for bs, r in decode_rates_by_batch_size(text).items()}
    # After each pair of prefill lines the interval also holds a prefill (1399.29, 1460.55, ...);
    # the first line has no interval of its own; the first bs=30 line follows bs=10 steps.
    assert rates == {
        10: [2153.70, 2135.33, 2151.27, 2135.45, 2154.11, 2138.01, 2160.45, 2144.82, 2129.37],
        30: [6105.17, 6010.82],
    }
    assert decode_rates_by_batch_size(text, rank=1) == {}


def test_report_takes_decode_rates_from_server_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench_helpers import levels as _levels

    from bench.results.records import ConfigRecord, RunResults

    res = RunResults(
        meta={},
        configs={
            "nospec": ConfigRecord(flags=(), levels=_levels({10: 1900.0, 30: 4400.0})),
            "switch-v2": ConfigRecord(
                flags=("--speculative-algorithm", "EAGLE3", "--speculative-disable-batch-size", "4"),
                compare_to=("nospec",),
                levels=_levels({10: 1300.0, 30: 2900.0}),
            ),
        },
    )
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.json").write_text(json.dumps(res.to_json()))
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "nospec.log").write_text((DATA / "nospec-decode.log").read_text())
    assert cli.main(["report", str(tmp_path / "r"), "--logs", str(logs)]) == 2
    assert "no server log for switch-v2" in capsys.readouterr().err

    line = "[2026-11-29 20:51:13] Decode batch, #running-req: {bs}, cuda graph: True, gen throughput (token/s): {t}, #queue-req: 0\n"
    (logs / "switch-v2.log").write_text("".join(line.format(bs=10, t=t) for t in (900.0, 1500.0, 1600.0, 1700.0)))
    assert cli.main(["report", str(tmp_path / "r"), "--logs", str(logs)]) == 0
    out = capsys.readouterr().out
    got = json.loads((tmp_path / "r" / "results.json").read_text())
    sw = {lv["concurrency"]: lv for lv in got["configs"]["switch-v2"]["levels"]}
    assert (sw[10]["decode_tok_per_s"], sw[10]["decode_lines"]) == (1600.0, 3)
    assert (sw[30]["decode_tok_per_s"], sw[30]["decode_lines"]) == (None, 0)
    assert got["decode_ratios"]["switch-v2"] == {"10": pytest.approx(1600.0 / 2144.8)}  # median, rounded to 0.1
    assert "Decode-step throughput at bs = C" in out and "| switch-v2 | 1600 (3) |  |" in out


def test_decode_rates_leave_out_a_profiles_wave() -> None:
    # docs/bench/wave-start-c70: one level of C=70 (15 steady lines at bs=70 in results.json), then
    # a wave-start profile of another wave at C=70, whose steps ran under the profiler
    import tarfile

    src = Path(__file__).resolve().parents[3] / "docs" / "bench" / "wave-start-c70" / "logs.tar.xz"
    with tarfile.open(src) as tar:
        member = tar.extractfile("bench-0/logs/switch-v2.log")
        assert member is not None
        text = member.read().decode(errors="replace")
    assert logparse.PROFILING in text
    level_only = decode_rates_by_batch_size(text)[70].rates
    with_profile = decode_rates_by_batch_size(text.replace(logparse.PROFILING, "Profiling"))[70].rates
    assert len(with_profile) == 15 and len(level_only) == 10


@pytest.mark.parametrize(
    "argv",
    [
        ["--extra-flags", "--disable-piecewise-cuda-graph"],
        ["--extra-flags=--disable-piecewise-cuda-graph"],
    ],
)
def test_extra_flags_take_a_single_server_flag(argv: list[str]) -> None:
    args = arguments.parse([*argv, "--quick"])
    assert args.extra_flags == "--disable-piecewise-cuda-graph"
    assert args.quick


def test_extra_flags_take_several_server_flags() -> None:
    args = arguments.parse(["--extra-flags", "--attention-backend flashinfer", "--concurrency", "10"])
    assert args.extra_flags == "--attention-backend flashinfer"
    assert args.concurrency == [10]


def test_parse_threshold() -> None:
    text = (
        '# TYPE sglang:spec_switch_threshold gauge\nsglang:spec_switch_threshold{model_name="m",tp_rank="0"} 17.0\n'
        'sglang:spec_switch_tokens_per_second{batch_size="10",mode="spec"} 3120.5\n'
    )
    assert parse_threshold(text) == 17
    assert parse_threshold(METRICS) is None
    assert parse_metrics(text) is None  # the gauges are not counters
