"""make's set-up step (ci/bootstrap-venv.sh) on a copy of the project in tmp_path (CPU, fast)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _project(tmp_path: Path) -> Path:
    (tmp_path / "ci").mkdir()
    shutil.copy(ROOT / "ci/bootstrap-venv.sh", tmp_path / "ci/bootstrap-venv.sh")
    (tmp_path / "ci/requirements.txt").write_text("pytest\n")
    return tmp_path


def _run(root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "ci/bootstrap-venv.sh"], cwd=root, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **env}
    )


def test_no_python_is_a_clear_error(tmp_path: Path) -> None:
    root = _project(tmp_path)
    res = _run(root, BOOTSTRAP_PYTHON="/nonexistent/python3.11")
    assert res.returncode == 2
    assert (
        "setup: no Python found (/nonexistent/python3.11); install Python 3.11.4+ or set BOOTSTRAP_PYTHON" in res.stderr
    )
    assert not (root / ".venv").exists()


def test_an_old_python_is_refused(tmp_path: Path) -> None:
    root = _project(tmp_path)
    old = tmp_path / "python3.9"
    old.write_text("#!/bin/sh\n[ \"$1\" = -V ] && { echo 'Python 3.9.2'; exit 0; }\nexit 1\n")
    old.chmod(0o755)
    res = _run(root, BOOTSTRAP_PYTHON=str(old))
    assert res.returncode == 2 and "is Python 3.9.2, the toolkit needs Python 3.11.4 or newer" in res.stderr


def _fake_python(path: Path, version: tuple[int, int, int]) -> None:
    """A python that answers -V and the version check the way that release would."""
    text = ".".join(map(str, version))
    path.write_text(
        f"#!/bin/sh\n[ \"$1\" = -V ] && {{ echo 'Python {text}'; exit 0; }}\n"
        f"exec {sys.executable} -c 'import sys; sys.exit({version} < (3, 11, 4))'\n"
    )
    path.chmod(0o755)


def test_a_python_311_before_3114_is_passed_over(tmp_path: Path) -> None:
    root = _project(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_python(bin_dir / "python3.11", (3, 11, 2))  # Debian 12's: tarfile has no extraction filters
    _fake_python(bin_dir / "python3", (3, 11, 2))
    res = subprocess.run(
        ["bash", "ci/bootstrap-venv.sh"],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
    )
    assert res.returncode == 2
    assert "no Python 3.11.4 or newer on PATH (found: python3.11 (Python 3.11.2) python3 (Python 3.11.2))" in res.stderr
    res = _run(root, BOOTSTRAP_PYTHON=str(bin_dir / "python3.11"))
    assert res.returncode == 2 and "is Python 3.11.2, the toolkit needs Python 3.11.4 or newer" in res.stderr
    assert not (root / ".venv").exists()


def test_pip_runs_only_when_the_requirements_changed(tmp_path: Path) -> None:
    root = _project(tmp_path)
    (root / ".venv/bin").mkdir(parents=True)
    calls = tmp_path / "pip-calls"
    fake = root / ".venv/bin/python"  # records what it is asked to do instead of installing
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(0o755)
    _stamp_base(root)
    res = _run(root)
    assert res.returncode == 0 and res.stdout == "" and res.stderr == "" and not calls.exists()
    (root / "ci/requirements.txt").write_text("pytest\n# changed\n")
    res = _run(root)
    assert res.returncode == 0 and "[setup] installing ci/requirements.txt into .venv" in res.stdout
    assert calls.read_text() == "-m pip install --quiet --disable-pip-version-check -r ci/requirements.txt\n"
    new_digest = hashlib.sha256((root / "ci/requirements.txt").read_bytes()).hexdigest()
    assert (root / ".venv/.requirements.sha256").read_text().strip() == new_digest


def _site_packages(venv: Path) -> Path:
    out = subprocess.run(
        [str(venv / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def _stamp_base(root: Path) -> None:
    """Mark .venv as set up for the current ci/requirements.txt."""
    digest = hashlib.sha256((root / "ci/requirements.txt").read_bytes()).hexdigest()
    (root / ".venv/.requirements.sha256").write_text(digest + "\n")


def _project_with_line(tmp_path: Path) -> Path:
    """A project whose .venv is set up (a real one, without pip) and a line v9 that pins nothing more."""
    root = _project(tmp_path)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / ".venv")], check=True)
    _stamp_base(root)
    (root / "lines/v9").mkdir(parents=True)
    (root / "lines/v9/requirements.txt").write_text("# nothing the base lacks\n")
    return root


def _set_up_line(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "ci/bootstrap-venv.sh", "lines/v9/requirements.txt", ".venv-v9"],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"},
    )


def test_a_line_environment_sees_the_base_one_and_follows_its_changes(tmp_path: Path) -> None:
    root = _project_with_line(tmp_path)
    (_site_packages(root / ".venv") / "only_in_base.py").write_text("WHERE = 'base'\n")
    res = _set_up_line(root)
    assert res.returncode == 0, res.stderr
    assert "[setup] creating .venv-v9 over .venv" in res.stdout
    seen = subprocess.run(
        [str(root / ".venv-v9/bin/python"), "-c", "import only_in_base, sys; print(only_in_base.WHERE, sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert seen.stdout.split() == ["base", str(root / ".venv-v9")]
    res = _set_up_line(root)
    assert res.returncode == 0 and res.stdout == ""
    (root / "ci/requirements.txt").write_text("pytest\n# changed\n")  # as if .venv was brought up to date
    _stamp_base(root)
    res = _set_up_line(root)
    assert res.returncode == 0 and "[setup] installing lines/v9/requirements.txt into .venv-v9" in res.stdout


def test_a_line_environment_with_its_own_copy_of_everything_is_made_again_over_the_base(tmp_path: Path) -> None:
    root = _project_with_line(tmp_path)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / ".venv-v9")], check=True)
    (_site_packages(root / ".venv-v9") / "old_copy.py").write_text("")
    res = _set_up_line(root)
    assert res.returncode == 0, res.stderr
    assert "[setup] .venv-v9 holds its own copy of every package; making it again over .venv" in res.stdout
    site = _site_packages(root / ".venv-v9")
    assert (site / "_base_venv.pth").read_text().strip() == str(_site_packages(root / ".venv"))
    assert not (site / "old_copy.py").exists()
