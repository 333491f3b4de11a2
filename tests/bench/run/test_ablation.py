"""`--without PATCH`: each speculating config again from a copy of the tree with one patch undone,
against the fake server of tests/bench/data/fake_tree (CPU), the patch made by git in tmp_path."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_helpers import FAKE_TREE, run_fake_bench  # noqa: E402

from bench.errors import BenchUsageError  # noqa: E402
from bench.run import ablation  # noqa: E402

SERVER = "python/sglang/launch_server.py"
MARK = "served by the patched tree"


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def _patched_tree(tmp_path: Path) -> tuple[Path, Path]:
    """The fake tree with a patch applied that makes its server say MARK, and the patch file."""
    tree = tmp_path / "tree"
    shutil.copytree(FAKE_TREE, tree, ignore=shutil.ignore_patterns("__pycache__"))
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    server = tree / SERVER
    announce = 'print(f"[fake TP0] fake server on'
    assert announce in server.read_text()
    server.write_text(server.read_text().replace(announce, f'print("[fake TP0] {MARK}", flush=True)\n{announce}'))
    (tree / "docs.md").write_text("not served\n")
    _git(tree, "add", "-A")
    patch = tmp_path / "0042-mark-the-server.patch"
    patch.write_text("Subject: [PATCH] mark the server\n---\n" + _git(tree, "diff", "--cached", "--full-index"))
    return tree, patch


def test_without_serves_each_speculating_config_again_from_the_tree_without_the_patch(tmp_path: Path) -> None:
    tree, patch = _patched_tree(tmp_path)
    out = tmp_path / "out"
    p = run_fake_bench(
        out,
        *("--tree", str(tree), "--model", "/fake/target", "--draft-model", "/fake/draft"),
        *("--configs", "nospec,spec", "--concurrency", "1,2", "--num-requests", "2", "--max-new-tokens", "4"),
        *("--repeat", "nospec", "--without", str(patch)),
    )
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert list(res["configs"]) == ["nospec", "spec", "nospec-again", "spec-without-0042"]
    twin = res["configs"]["spec-without-0042"]
    assert twin["compare_to"] == ["spec"] and twin["flags"] == res["configs"]["spec"]["flags"]
    assert set(res["ratios"]["spec-without-0042"]) == {"1", "2"}
    own = res["meta"]["trees of their own"]
    assert list(own) == ["spec-without-0042"] and own["spec-without-0042"].endswith("without-0042-mark-the-server")
    logs = {name: (out / "logs" / f"{name}.log").read_text() for name in res["configs"]}
    assert all(MARK in logs[n] for n in ("nospec", "spec", "nospec-again")) and MARK not in logs["spec-without-0042"]
    assert "docs.md" in p.stderr, "the patch's files a server does not run are named as left alone"
    assert (tree / "docs.md").is_file() and MARK in (tree / SERVER).read_text(), "the run's tree is left as it was"
    assert not Path(own["spec-without-0042"]).exists(), "the copy goes with the run"
    md = (out / "results.md").read_text()
    assert "served from a tree of its own: `without-0042-mark-the-server`" in md
    assert "| spec-without-0042 / max(spec) |" in md


def test_without_refuses_a_patch_that_does_not_come_off_alone(tmp_path: Path) -> None:
    tree, patch = _patched_tree(tmp_path)
    server = tree / SERVER
    server.write_text(server.read_text().replace(MARK, MARK + " and changed since"))
    with pytest.raises(BenchUsageError) as e:
        ablation.tree_without(tree, patch, tmp_path / "scratch")
    msg = str(e.value)
    assert "--without 0042-mark-the-server.patch: it does not come off" in msg
    assert f"{SERVER}: hunk @@" in msg and "and changed since" in msg and "nothing was written" in msg


def test_without_names_a_patch_of_the_series_by_its_number() -> None:
    assert ablation.find_patch(None, "0016").name == "0016-hidden-states-copy-on-request.patch"
    with pytest.raises(BenchUsageError, match="--without 0099: no patch of the v0.5.9 series matches it"):
        ablation.find_patch(None, "0099")


def test_without_configs_names_the_configs_served_again(tmp_path: Path) -> None:
    from bench.configs import parse_configs

    undone = ablation.Ablation("0001-sm120-support.patch", "0001", tmp_path)
    cfgs = parse_configs("nospec,spec-v2,switch-v2")
    assert [c.name for c in ablation.twins(cfgs, undone)] == ["spec-v2-without-0001", "switch-v2-without-0001"]
    both = ablation.twins(cfgs, undone, "nospec, switch-v2")
    assert [(c.name, c.compare_to, c.tree) for c in both] == [
        ("nospec-without-0001", ("nospec",), tmp_path),
        ("switch-v2-without-0001", ("switch-v2",), tmp_path),
    ]
    with pytest.raises(BenchUsageError, match="spec-v1 not among the run's configs"):
        ablation.twins(cfgs, undone, "spec-v1")
    with pytest.raises(BenchUsageError, match="none of the run's configs speculates"):
        ablation.twins(parse_configs("nospec"), undone)


def test_without_configs_alone_is_refused(tmp_path: Path) -> None:
    p = run_fake_bench(
        tmp_path / "out", "--model", "/fake/target", "--configs", "nospec", "--without-configs", "nospec"
    )
    assert p.returncode == 2 and "give --without PATCH" in p.stderr, p.stderr[-2000:]
