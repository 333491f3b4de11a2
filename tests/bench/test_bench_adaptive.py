"""Upstream's --speculative-adaptive as benchmark configs: the tier file that turns speculation off
above N, read by the routing code of the v0.5.15 tree itself, and the refusal on a tree whose
SGLang lacks a config's flags (CPU, fast)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from bench_helpers import levels

from bench import cli
from bench.configs import CONFIGS, ZERO_STEP_PLAIN_DECODE, off_above_tiers, parse_configs
from bench.results.records import ConfigRecord, RunResults
from bench.results.report import analyse
from bench.run import sweep
from bench.run.server import missing_server_args

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM_ADAPTIVE = (
    ROOT / "build" / "sglang-v0.5.15" / "python" / "sglang" / "srt" / "speculative" / "adaptive_spec_params.py"
)


EAGLE_FIELDS = "".join(
    f"{n} = None\n"
    for n in (
        "speculative_algorithm",
        "speculative_num_steps",
        "speculative_eagle_topk",
        "speculative_num_draft_tokens",
    )
)


def _tree(tmp_path: Path, server_args: str) -> Path:
    srt = tmp_path / "python" / "sglang" / "srt"
    srt.mkdir(parents=True)
    (srt.parent / "__init__.py").write_text("")
    (srt / "server_args.py").write_text(EAGLE_FIELDS + server_args)
    return tmp_path


def _upstream_router(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """0.5.15's adaptive_spec_params, loaded alone (its one runtime import is a logging helper)."""
    if not UPSTREAM_ADAPTIVE.is_file():
        pytest.skip(f"no v0.5.15 tree ({UPSTREAM_ADAPTIVE}): make apply SGLANG_REF=v0.5.15")
    utils = types.ModuleType("sglang.srt.utils")
    utils.log_info_on_rank0 = lambda logger, msg: None  # type: ignore[attr-defined]
    for name in ("sglang", "sglang.srt"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.utils", utils)
    module = types.ModuleType("adaptive_spec_params")
    exec(compile(UPSTREAM_ADAPTIVE.read_text(encoding="utf-8"), str(UPSTREAM_ADAPTIVE), "exec"), module.__dict__)
    return module


def test_the_tier_file_speculates_up_to_n_and_not_above(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    upstream = _upstream_router(monkeypatch)
    path = tmp_path / "tiers.json"
    path.write_text(json.dumps(off_above_tiers(8, 3)))
    params = upstream.AdaptiveSpeculativeParams(initial_steps=3, cfg_path=str(path))
    params.set_cuda_graph_bs([1, 2, 4, 8, 12, 16, 24, 32, 48, 64])
    steps = {bs: params.get_steps_for_batch(bs) for bs in range(1, 65)}
    assert {bs for bs, s in steps.items() if s == 3} == set(range(1, 9))
    assert all(s == 0 for bs, s in steps.items() if bs > 8)


def test_adaptive_configs_are_v2_with_thresholds_after_the_baselines() -> None:
    assert [c.name for c in parse_configs("adaptive-v2-off,spec-v2,nospec,adaptive-v2")] == [
        "spec-v2",
        "nospec",
        "adaptive-v2",
        "adaptive-v2-off",
    ]
    off = CONFIGS["adaptive-v2-off"]
    assert off.needs_thresholds and not off.switch and "--speculative-adaptive" in off.flags
    assert "speculative_adaptive_config" in off.server_args_needed()
    assert {c.name for c in CONFIGS.values() if c.since} == {
        "adaptive-v2",
        "adaptive-v2-off",
        "adaptive-v2-off-skip",
        "adaptive-v2-off-plain",
        "adaptive-v2-off-plain-skip",
    }
    # Upstream's steps=0, also on a release line's tree, whose steps=0 is a plain decode by default.
    assert off.env == CONFIGS["adaptive-v2"].env == {ZERO_STEP_PLAIN_DECODE: "0"}
    for name in ("adaptive-v2-off-skip", "adaptive-v2-off-plain", "adaptive-v2-off-plain-skip"):
        variant = CONFIGS[name]
        assert variant.flags == off.flags and variant.adaptive_tiers, name
        assert variant.env == {**off.env, **dict.fromkeys(variant.env_needed, "1")}, name


def test_configs_the_tree_cannot_run_are_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ours = _tree(tmp_path / "ours", "speculative_disable_batch_size = None\nspeculative_enable_batch_size = None\n")
    upstream = _tree(tmp_path / "upstream", "speculative_adaptive: bool = False\nspeculative_adaptive_config = None\n")
    assert missing_server_args(upstream, ["speculative_adaptive", "speculative_disable_batch_size"]) == [
        "speculative_disable_batch_size"
    ]
    out = str(tmp_path / "out")
    assert cli.main(["--configs", "nospec,adaptive-v2", "--tree", str(ours), "--out", out]) == 2
    err = capsys.readouterr().err
    assert "adaptive-v2 needs --speculative-adaptive;" not in err  # one config, one entry
    assert "adaptive-v2 needs --speculative-adaptive." in err and "0.5.11" in err and "nospec" not in err
    assert cli.main(["--configs", "switch-v2,adaptive-v2", "--tree", str(upstream), "--out", out]) == 2
    err = capsys.readouterr().err
    assert "switch-v2 needs --speculative-disable-batch-size" in err and "adaptive-v2" not in err.split("needs")[0]


def test_a_config_whose_environment_switch_the_tree_lacks_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fields = "speculative_adaptive: bool = False\nspeculative_adaptive_config = None\n"
    before, after = _tree(tmp_path / "0.5.13", fields), _tree(tmp_path / "0.5.15", fields)
    (after / "python" / "sglang" / "srt" / "environ.py").write_text(
        "class Envs:\n    SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND = EnvBool(False)\n"
    )
    out = str(tmp_path / "out")
    assert (
        cli.main(["--configs", "nospec,adaptive-v2-off,adaptive-v2-off-skip", "--tree", str(before), "--out", out]) == 2
    )
    err = capsys.readouterr().err
    assert "adaptive-v2-off-skip needs SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND (environment)" in err
    assert "adaptive-v2-off needs" not in err and "0.5.14" in err
    sweep.refuse_unsupported([CONFIGS["adaptive-v2-off-skip"]], after)  # declared there: accepted
    # Upstream 0.5.15 has no plain-decode switch; this series' v0.5.15 line declares it.
    assert cli.main(["--configs", "nospec,adaptive-v2-off-plain", "--tree", str(after), "--out", out]) == 2
    assert "adaptive-v2-off-plain needs SGLANG_SPEC_ZERO_STEP_PLAIN_DECODE (environment)" in capsys.readouterr().err
    with (after / "python" / "sglang" / "srt" / "environ.py").open("a") as environ:
        environ.write("    SGLANG_SPEC_ZERO_STEP_PLAIN_DECODE = EnvBool(False)\n")
    sweep.refuse_unsupported([CONFIGS["adaptive-v2-off-plain"], CONFIGS["adaptive-v2-off-plain-skip"]], after)


def test_an_adaptive_config_gets_no_recommendation_of_its_own() -> None:
    """Its levels above N run no speculation: read as an always-speculating sweep, they would make
    the report advise serving without speculation, with switch flags a 0.5.15 tree does not have."""
    nospec = {10: 2000.0, 30: 5500.0, 100: 14000.0}
    eagle = ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3")
    run = RunResults(
        meta={},
        configs={
            "nospec": ConfigRecord(flags=(), levels=levels(nospec)),
            "spec-v2": ConfigRecord(flags=eagle, levels=levels({c: v * 0.6 for c, v in nospec.items()})),
            "adaptive-v2-off": ConfigRecord(
                flags=(*eagle, "--speculative-adaptive"),
                compare_to=("nospec", "spec-v2"),
                levels=levels({c: v * 0.9 for c, v in nospec.items()}),
            ),
        },
    )
    assert set(analyse(run).recommendations) == {"spec-v2"}
