"""The Makefile treats every variable as the user's text: nothing in a value runs as make or shell
code, refs are refused before any recipe, and each value reaches the command as one quoted word."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=120
    )


def commands(*args: str) -> list[list[str]]:
    """The commands `make -n` would run, split as the shell would split them."""
    res = make("-n", *args)
    assert res.returncode == 0, res.stderr
    return [shlex.split(line) for line in res.stdout.splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize(
    "value", ["v0.5.9;touch {x}", "$(shell touch {x})", "`touch {x}`", "v0.5.9 $$(touch {x})", "v0.5.9\ntouch {x}"]
)
@pytest.mark.parametrize("var", ["SGLANG_REF", "FROM", "REFS"])
@pytest.mark.parametrize("dry", [True, False])
def test_a_ref_that_is_not_a_ref_runs_nothing(tmp_path: Path, var: str, value: str, dry: bool) -> None:
    marker = tmp_path / "x"
    target = {"SGLANG_REF": "apply", "FROM": "rebase", "REFS": "status"}[var]
    res = make(
        *(["-n"] if dry else []),
        target,
        f"{var}={value.format(x=marker)}",
        "SGLANG_REF=v0.5.10" if var == "FROM" else "PYTHON=false",
    )
    assert res.returncode != 0
    assert "is not a git" in res.stderr and "nothing was run" in res.stderr, res.stderr
    assert not marker.exists()


@pytest.mark.parametrize("var", ["TREE", "SGLANG_REPO", "FORCE", "PYTEST_ARGS", "PYTHON", "OFFLINE"])
def test_other_values_are_text_even_under_dry_run(tmp_path: Path, var: str) -> None:
    marker = tmp_path / "x"
    res = make("-n", "test", f"{var}=$(shell touch {marker}) `touch {marker}` $$(touch {marker})")
    assert res.returncode == 0, res.stderr
    assert not marker.exists()


@pytest.mark.parametrize("words", ["x'; touch {x}; echo '", "the batch's ids; touch {x}"])
@pytest.mark.parametrize("dry", [True, False])
def test_a_patch_subject_is_text(tmp_path: Path, dry: bool, words: str) -> None:
    marker = tmp_path / "x"
    subject = "speculative: " + words.format(x=marker)
    res = make(*(["-n"] if dry else []), "new", f"SUBJECT={subject}", "PYTHON=false")
    assert not marker.exists(), res.stdout + res.stderr
    if dry:
        assert commands("new", f"SUBJECT={subject}", "PYTHON=python3")[-1][-2:] == ["new", subject]


def test_paths_and_arguments_arrive_as_the_user_wrote_them() -> None:
    tree = "/tmp/a tree/with 'quote' and $(dollar)"
    cmd = commands("apply", f"TREE={tree}", "PYTHON=python3")[-1]
    assert cmd[:3] == ["python3", "-m", "tools"] and cmd[cmd.index("--tree") + 1] == tree
    # Argument lists split on blanks, each word as it is, never globbed or substituted.
    cmd = commands("test", "PYTEST_ARGS=-k *gpu* $(x)", "PYTHON=python3")[-1]
    assert cmd[-3:] == ["-k", "*gpu*", "$(x)"]
    cmd = commands("status", "REFS=v0.5.10 v0.5.15", "PYTHON=python3")[-1]
    assert cmd[cmd.index("--refs") + 1] == "v0.5.10 v0.5.15"


def test_bench_runs_on_the_line_sglang_ref_names() -> None:
    cmd = commands("bench", "SGLANG_REF=v0.5.15", "BENCH_ARGS=--quick", "PYTHON=python3")[-1]
    assert cmd == ["python3", "-m", "bench", "--ref", "v0.5.15", "--quick"]


def test_help_names_every_target_and_variable() -> None:
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z]+):", text, re.M))
    user_vars = re.search(r"^USER_VARS := (.*?)\n\S", text, re.S | re.M)
    assert user_vars and targets
    help_text = make("help").stdout
    listed = {line.split()[0] for line in help_text.splitlines() if line[:1].isalpha() and ":" not in line.split()[0]}
    assert targets <= listed, targets - listed
    names = user_vars.group(1).replace("\\", " ").split()
    missing = [n for n in names if n not in help_text]
    assert not missing, f"make help does not mention {missing}"


def test_one_place_decides_a_lines_tree() -> None:
    from bench.run.server import line_tree

    told = subprocess.run(
        [sys.executable, "-m", "tools", "--ref", "v0.5.15", "tree"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(told) == ROOT / "build" / "sglang-v0.5.15" == line_tree("v0.5.15")
    assert "make-bundle.sh 'v0.5.15' \"$(" in make("-n", "bundle", "SGLANG_REF=v0.5.15", "PYTHON=python3").stdout


def test_one_place_names_a_lines_paths() -> None:
    def line(*args: str) -> dict[str, str]:
        out = subprocess.run(
            [sys.executable, "-m", "tools", *args, "line"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        return dict(row.split("\t", 1) for row in out.splitlines())

    default, release = line(), line("--ref", "v0.5.15")
    assert default["dir"] == str(ROOT) and default["requirements"] == default["venv"] == ""
    assert default["gpu-wheels"] == str(ROOT / "ci" / "gpu" / "wheels.txt")
    assert release["dir"] == str(ROOT / "lines" / "v0.5.15") and release["ref"] == "v0.5.15"
    assert release["requirements"] == str(ROOT / "lines" / "v0.5.15" / "requirements.txt")
    assert release["venv"] == str(ROOT / ".venv-v0.5.15") and release["tree"] == str(ROOT / "build" / "sglang-v0.5.15")
    # make asks the tool for the line's environment instead of spelling out lines/<ref>/ itself.
    recipe = make("-n", "test", "SGLANG_REF=v0.5.15", "PYTHON=python3").stdout
    assert "-m tools --ref v0.5.15  line requirements" in recipe and "lines/" not in recipe
