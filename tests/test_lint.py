"""The project's own code passes ruff (lint and format) and mypy with the settings in pyproject.toml."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Each test folder imports its helpers (conftest, sglang_cpu, bench_helpers) as top-level modules,
# as pytest does from that folder: one mypy run per folder, or the same names would clash.
# tests/gpu and the top-level test files are in pyproject.toml's mypy files.
TEST_DIRS = [
    p.relative_to(ROOT).as_posix()
    for p in [
        *sorted(d for d in (ROOT / "tests").iterdir() if d.is_dir() and d.name not in ("gpu", "__pycache__")),
        *sorted(ROOT.glob("lines/*/tests/patches")),
    ]
]


# The folders of the project's own Python (the patches follow SGLang's black instead).
PROJECT_CODE = ("tools", "bench", "tests", "lines", "ci")


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True)


def test_ruff() -> None:
    res = _run("ruff", "check", *PROJECT_CODE)
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff_format() -> None:
    """The project's own code as `ruff format` writes it (the patches follow SGLang's black)."""
    res = _run("ruff", "format", "--check", *PROJECT_CODE)
    assert res.returncode == 0, res.stdout + res.stderr


def test_mypy() -> None:
    res = _run("mypy")
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("folder", TEST_DIRS)
def test_mypy_tests(folder: str) -> None:
    res = _run("mypy", folder)
    assert res.returncode == 0, res.stdout + res.stderr
