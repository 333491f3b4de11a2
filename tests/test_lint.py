"""The project's own code passes ruff (lint and format) and mypy with the settings in pyproject.toml."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True)


def test_ruff() -> None:
    res = _run("ruff", "check", "tools", "bench", "tests", "lines")
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff_format() -> None:
    """The project's own code as `ruff format` writes it (the patches follow SGLang's black)."""
    res = _run("ruff", "format", "--check", "tools", "bench", "tests", "lines")
    assert res.returncode == 0, res.stdout + res.stderr


def test_mypy() -> None:
    res = _run("mypy")
    assert res.returncode == 0, res.stdout + res.stderr
