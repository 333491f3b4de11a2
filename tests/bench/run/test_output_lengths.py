"""--output-len-spread: a closed loop whose requests do not all ask for the same number of tokens
(bench.run.settings.RunSettings.output_lengths, the client's per-request max_new_tokens), against
the fake server of tests/bench/data/fake_tree, which answers each request with its max_new_tokens."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_helpers import run_fake_bench  # noqa: E402

from bench import cli  # noqa: E402
from bench.run.arguments import parse  # noqa: E402
from bench.run.settings import RunSettings  # noqa: E402


def settings(*argv: str) -> RunSettings:
    return RunSettings.from_args(parse(list(argv)))


def test_lengths_spread_around_max_new_tokens_the_same_for_every_run() -> None:
    spread = settings("--max-new-tokens", "256", "--output-len-spread", "0.5")
    lengths = spread.output_lengths(30, 90)
    assert lengths is not None and len(lengths) == 90
    assert 128 <= min(lengths) < 160 and 352 < max(lengths) <= 384
    assert 230 < statistics.mean(lengths) < 282
    assert lengths == settings("--max-new-tokens", "256", "--output-len-spread", "0.5").output_lengths(30, 90)
    assert spread.output_lengths(48, 90) != lengths  # each level draws its own
    assert settings("--max-new-tokens", "256").output_lengths(30, 90) is None  # default: all equal


@pytest.mark.parametrize("value", ["1", "-0.1", "1.5"])
def test_a_spread_outside_0_to_1_is_a_usage_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--output-len-spread", value]) == 2
    assert f"--output-len-spread must be at least 0 and below 1, got {float(value):g}" in capsys.readouterr().err


def test_each_request_asks_for_its_own_length(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["--configs", "nospec", "--concurrency", "1,4", "--num-requests", "8", "--max-new-tokens", "8"]
    p = run_fake_bench(out, "--model", "/fake/target", *argv, "--output-len-spread", "0.5")
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert res["meta"]["output_len_spread"] == 0.5
    asked = settings(*argv, "--output-len-spread", "0.5")
    levels = res["configs"]["nospec"]["levels"]
    for level in levels:
        lengths = asked.output_lengths(level["concurrency"], level["requests"])
        assert lengths is not None and level["output_tokens"] == sum(lengths)
    assert any(level["output_tokens"] != 8 * level["requests"] for level in levels)
