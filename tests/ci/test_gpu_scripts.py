"""The device scripts refuse a GPU bundle built from other patches than the checkout's (CPU, fast).

Runs the real ci/gpu scripts on a copy of the project's lines in tmp_path, with a stand-in for the
bundle builder (it downloads the GPU wheels).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Writes the two files run-on-device.sh looks for, and which wheel list it was given.
FAKE_BUILDER = """#!/bin/bash
set -euo pipefail
rm -rf "$1" && mkdir -p "$1"
echo 'exit 0' > "$1/setup.sh"
tar cf "$1/tree.tar.xz" -C "$2" python
echo "$3" > "$1/wheels-used"
"""


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@invalid", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


@pytest.fixture
def project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    shutil.copytree(ROOT / "ci" / "gpu", proj / "ci" / "gpu")
    shutil.copytree(ROOT / "tools", proj / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "patches", proj / "patches")
    shutil.copytree(ROOT / "lines", proj / "lines")
    for name in ("series", "sglang.lock"):
        shutil.copy(ROOT / name, proj / name)
    for ref in ("v0.5.9", "v0.5.15"):
        tree = proj / "build" / f"sglang-{ref}"
        (tree / "python" / "sglang").mkdir(parents=True)
        (tree / "python" / "sglang" / "__init__.py").write_text("")
        _git(tree, "init", "-q")
        _git(tree, "add", "-A")
        _git(tree, "commit", "-qm", "patched")
    builder = tmp_path / "build-bundle.sh"
    builder.write_text(FAKE_BUILDER)
    return proj


def _run(project: Path, *cmd: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {
        "PATH": "/usr/bin:/bin",
        "BUNDLE_SCRIPT": str(project.parent / "build-bundle.sh"),
        "OUT": str(project / "out"),
        "PYTHON": sys.executable,  # the toolkit's, which names the line's paths
        **env,
    }
    return subprocess.run(["bash", *cmd], cwd=project, env=full_env, capture_output=True, text=True, timeout=120)


def test_bundle_is_stamped_with_the_series_and_a_changed_patch_is_refused(project: Path) -> None:
    made = _run(project, "ci/gpu/make-bundle.sh")
    assert made.returncode == 0, made.stderr
    stamp = (project / ".gpu" / "patches.sha256").read_text().strip()
    assert stamp == _run(project, "ci/gpu/patches-stamp.sh").stdout.strip() and len(stamp) == 64
    assert (project / ".gpu" / "wheels-used").read_text().strip() == "ci/gpu/wheels.txt"

    # The stamp check comes before setup; `env` then stops at the first thing the CPU box lacks.
    fresh = _run(project, "ci/gpu/run-on-device.sh", "env")
    assert "not built from this checkout's patches" not in fresh.stderr and "setup done" in fresh.stderr

    patch = sorted((project / "patches").glob("*.patch"))[-1]
    patch.write_text(patch.read_text() + "\n")
    stale = _run(project, "ci/gpu/run-on-device.sh", "env")
    assert stale.returncode == 2
    assert "not built from this checkout's patches" in stale.stderr and "make bundle" in stale.stderr


def test_bundle_refuses_a_tree_with_uncommitted_changes(project: Path) -> None:
    init = project / "build" / "sglang-v0.5.9" / "python" / "sglang" / "__init__.py"
    init.write_text("edited = True\n")
    made = _run(project, "ci/gpu/make-bundle.sh")
    assert made.returncode == 2 and "uncommitted changes" in made.stderr
    assert not (project / ".gpu").exists()


def test_bundle_without_a_tree_says_to_apply(project: Path) -> None:
    made = _run(project, "ci/gpu/make-bundle.sh", "v0.5.9", "build/nowhere")
    assert made.returncode == 2 and "make apply" in made.stderr


def test_a_line_bundle_carries_its_wheels_and_its_own_stamp(project: Path) -> None:
    made = _run(project, "ci/gpu/make-bundle.sh", "v0.5.15")
    assert made.returncode == 0, made.stderr
    gpu = project / ".gpu"
    assert (gpu / "line").read_text().strip() == "v0.5.15"
    assert (gpu / "line-dir").read_text().strip() == "lines/v0.5.15"
    assert (gpu / "wheels-used").read_text().strip() == "lines/v0.5.15/gpu-wheels.txt"
    stamp = (gpu / "patches.sha256").read_text().strip()
    assert stamp == _run(project, "ci/gpu/patches-stamp.sh", "lines/v0.5.15").stdout.strip()
    assert stamp != _run(project, "ci/gpu/patches-stamp.sh").stdout.strip()
    fresh = _run(project, "ci/gpu/run-on-device.sh", "env")
    assert "not built from this checkout's patches" not in fresh.stderr and "setup done" in fresh.stderr

    patch = next((project / "lines" / "v0.5.15" / "patches").glob("*.patch"))
    patch.write_text(patch.read_text() + "\n")
    stale = _run(project, "ci/gpu/run-on-device.sh", "env")
    assert stale.returncode == 2 and "make bundle SGLANG_REF=v0.5.15" in stale.stderr


def test_a_cpu_only_line_and_an_unknown_ref_are_refused(project: Path) -> None:
    cpu_only = _run(project, "ci/gpu/make-bundle.sh", "v0.5.23")
    assert cpu_only.returncode == 2 and "CPU-tested only" in cpu_only.stderr
    unknown = _run(project, "ci/gpu/make-bundle.sh", "v9.9.9")
    assert unknown.returncode == 2 and "no line v9.9.9" in unknown.stderr
