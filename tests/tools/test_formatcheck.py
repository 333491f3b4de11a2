"""`make check` runs SGLang's formatters on what the series changes (black 24.10.0, isort 5.13.2)."""

import pytest

from tools.formatcheck import BLACK_VERSION, ISORT_VERSION, missing_formatters

from conftest import Env, commit_in_tree, git, header


def test_the_pinned_formatters_are_installed() -> None:
    assert missing_formatters() == [], f"ci/requirements.txt pins black {BLACK_VERSION} and isort {ISORT_VERSION}"


def _patch(env: Env, files: dict[str, str]) -> None:
    commit_in_tree(env.tree, header("Add a module"), files)
    assert env.tool("refresh") == 0


def test_badly_formatted_patch_code_fails_check(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    _patch(env, {"python/sglang/srt/new_mod.py": "import sys\nimport os\nx=dict(a = 1)\n"})
    assert env.tool("check") == 1
    out = capsys.readouterr().out
    assert "python/sglang/srt/new_mod.py: black would reformat the patched file" in out
    assert "+x = dict(a=1)" in out
    assert "python/sglang/srt/new_mod.py: isort would reformat the patched file" in out


def test_formatted_patch_code_passes(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    _patch(env, {"python/sglang/srt/new_mod.py": "import os\nimport sys\n\nx = dict(a=1)\n"})
    assert env.tool("check") == 0, capsys.readouterr().out


def test_upstreams_own_formatting_is_not_blamed_on_a_patch(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    (env.upstream / "python/sglang/srt/ugly.py").write_text("y=2\nz=3\n")
    git(env.upstream, "add", "-A")
    git(env.upstream, "commit", "-qm", "ugly")
    git(env.upstream, "tag", "v1.0.1")
    assert env.tool("--ref", "v1.0.1", "apply") == 0
    tree = env.root / "build/sglang-v1.0.1"
    commit_in_tree(tree, header("Touch ugly"), {"python/sglang/srt/ugly.py": "y=2\nz=4\n"})
    assert env.tool("--ref", "v1.0.1", "refresh") == 0
    assert env.tool("--ref", "v1.0.1", "check") == 0, capsys.readouterr().out
