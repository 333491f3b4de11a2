"""A config's phases on its one server, against the fake server of tests/bench/data/fake_tree (CPU):
the levels again on a second traffic (--then-prompts)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_helpers import run_fake_bench  # noqa: E402

from bench.errors import BenchUsageError  # noqa: E402
from bench.run.arguments import parse  # noqa: E402
from bench.run.settings import run_target  # noqa: E402

THEN_MARK = "second-traffic prompt"


def _then_prompts(tmp_path: Path) -> Path:
    path = tmp_path / "then.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{THEN_MARK} {i}"}) + "\n" for i in range(3)))
    return path


def test_then_prompts_serve_the_levels_again_on_the_same_server(tmp_path: Path) -> None:
    out, then = tmp_path / "out", _then_prompts(tmp_path)
    p = run_fake_bench(
        out,
        *("--model", "/fake/target", "--draft-model", "/fake/draft", "--configs", "nospec,spec,switch-v1"),
        *("--concurrency", "1,2", "--num-requests", "2", "--max-new-tokens", "4", "--switch-thresholds", "2,1"),
        *("--then-prompts", str(then)),
        env={"FAKE_LOG_PROMPTS": "1"},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert list(res["configs"]) == ["nospec", "nospec-then", "spec", "spec-then", "switch-v1", "switch-v1-then"]
    assert res["meta"]["then_prompts"] == str(then)
    sw, sw_then = res["configs"]["switch-v1"], res["configs"]["switch-v1-then"]
    assert [lv["concurrency"] for lv in sw_then["levels"]] == [1, 2] and sw_then["flags"] == sw["flags"]
    assert sw_then["compare_to"] == [name + "-then" for name in sw["compare_to"]]
    assert set(res["ratios"]["switch-v1-then"]) == {"1", "2"}
    # no recommendation pits the second traffic's speculation against the first traffic's nospec
    assert not any(name.endswith("-then") for name in res.get("recommendations", {}))
    for name in ("nospec", "spec", "switch-v1"):
        log = (out / "logs" / f"{name}.log").read_text()
        assert log.count("fake server on") == 1, f"{name}: the second traffic needs the same server"
        first, _, second = log.partition(THEN_MARK)
        assert "request text" in first and "Decode batch" in second, name
        # every request after the first of the second traffic is of the second traffic
        texts = [line for line in second.splitlines() if "request text" in line]
        assert texts and all(THEN_MARK in line for line in texts), name
    md = (out / "results.md").read_text()
    assert "| switch-v1-then / max(nospec-then, spec-then) |" in md


def test_then_prompts_need_levels_and_a_readable_file(tmp_path: Path) -> None:
    def target(*argv: str) -> None:
        run_target(parse(["--model", "/fake/target", *argv]), tmp_path, tmp_path)

    with pytest.raises(BenchUsageError, match="--then-prompts serves the --concurrency levels again"):
        target("--request-rates", "4", "--then-prompts", str(_then_prompts(tmp_path)))
    with pytest.raises(BenchUsageError, match="--then-prompts: .*missing.jsonl"):
        target("--concurrency", "1", "--then-prompts", str(tmp_path / "missing.jsonl"))
    ok = run_target(
        parse(["--model", "/fake/target", "--then-prompts", str(_then_prompts(tmp_path))]), tmp_path, tmp_path
    )
    assert ok.then_prompts == tuple(f"{THEN_MARK} {i}" for i in range(3)) and ok.then_prompts_file


def test_then_again_serves_the_levels_again_with_the_runs_own_prompts(tmp_path: Path) -> None:
    prompts = tmp_path / "own.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"own prompt {i}"}) + "\n" for i in range(3)))
    out = tmp_path / "out"
    p = run_fake_bench(
        out,
        *("--model", "/fake/target", "--draft-model", "/fake/draft", "--configs", "spec"),
        *("--concurrency", "1,2", "--num-requests", "2", "--max-new-tokens", "4"),
        *("--prompts", str(prompts), "--then-again"),
        env={"FAKE_LOG_PROMPTS": "1"},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert list(res["configs"]) == ["spec", "spec-then"]
    assert [lv["concurrency"] for lv in res["configs"]["spec-then"]["levels"]] == [1, 2]
    assert res["meta"]["then_prompts"] == f"{prompts} (again)"
    log = (out / "logs" / "spec.log").read_text()
    # the fake server's threads may write into each other's log lines: read the texts, not the lines
    texts = re.findall(r"request text: ('(?:[^'\\]|\\.)*')", log)
    # the warm-up, the two levels (3 and 6 requests: three waves each), then the same requests again
    # (two in flight at C=2 reach the server in either order)
    first, again = texts[-18:-9], texts[-9:]
    assert sorted(first) == sorted(again) and all(text.startswith("'own prompt") for text in first)


def test_then_again_and_then_prompts_are_one_or_the_other(tmp_path: Path) -> None:
    def target(*argv: str) -> None:
        run_target(parse(["--model", "/fake/target", *argv]), tmp_path, tmp_path)

    with pytest.raises(BenchUsageError, match="--then-again serves the run's own prompts again"):
        target("--concurrency", "1", "--then-again", "--then-prompts", str(_then_prompts(tmp_path)))
    with pytest.raises(BenchUsageError, match="--then-again serves the --concurrency levels again"):
        target("--request-rates", "4", "--then-again")
