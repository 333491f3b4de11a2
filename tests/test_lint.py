"""The project's own code passes ruff and mypy with the settings in pyproject.toml."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True)


def test_ruff() -> None:
    res = _run("ruff", "check", "tools", "bench", "tests")
    assert res.returncode == 0, res.stdout + res.stderr


def test_mypy() -> None:
    res = _run("mypy")
    assert res.returncode == 0, res.stdout + res.stderr
