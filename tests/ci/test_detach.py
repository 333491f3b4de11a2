"""ci/gpu/detach.sh: a chain of device runs that outlives one call (CPU, a few seconds).

The real script on a copy of itself, with a stand-in for run-on-device.sh that records what it was
given and sleeps as told.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# MODE [SLEEP]: records its arguments and budget in its $OUT, sleeps, fails when MODE is "fail".
FAKE_RUNNER = """#!/bin/bash
echo "$* | DEVICE_TIMEOUT=$DEVICE_TIMEOUT DEVICE_TIMEOUT_CAP=$DEVICE_TIMEOUT_CAP" > "$OUT/args.txt"
echo "step output of $1"
sleep "${2:-0}"
[ "$1" != fail ]
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    (proj / "ci" / "gpu").mkdir(parents=True)
    shutil.copy(ROOT / "ci" / "gpu" / "detach.sh", proj / "ci" / "gpu" / "detach.sh")
    (proj / "fake-runner.sh").write_text(FAKE_RUNNER)
    (proj / "build").mkdir()
    (proj / "build" / "big").write_text("left behind")
    return proj


def _env(project: Path, chain: str = "chain", out: str = "out") -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "DETACH_DIR": str(project.parent / chain),
        "DETACH_RUNNER": "fake-runner.sh",
        "OUT": str(project.parent / out),
    }


def _detach(project: Path, *args: str, chain: str = "chain", out: str = "out") -> subprocess.CompletedProcess[str]:
    shutil.rmtree(project.parent / out, ignore_errors=True)  # the device empties $OUT before each call
    return subprocess.run(
        ["bash", "ci/gpu/detach.sh", *args],
        cwd=project,
        env=_env(project, chain, out),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _step(project: Path, index: int, name: str) -> str:
    with tarfile.open(project.parent / "out" / f"step-{index}.tgz") as packed:
        member = packed.extractfile(f"step-{index}/{name}" if name == "args.txt" else name)
        assert member is not None
        return member.read().decode()


def test_steps_run_in_order_share_the_seconds_and_come_back_packed(project: Path) -> None:
    done = _detach(project, "start", "300", "bench --configs 'a b'", "fail 0", "test -k 'x and y'")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (project.parent / "out").iterdir()) == [
        "chain.log",
        "step-0.tgz",
        "step-1.tgz",
        "step-2.tgz",
    ]
    first, last = _step(project, 0, "args.txt"), _step(project, 2, "args.txt")
    assert first.startswith("bench --configs a b | ") and "DEVICE_TIMEOUT_CAP=300" in first
    assert last.startswith("test -k x and y | ")
    budgets = [int(_step(project, i, "args.txt").split("DEVICE_TIMEOUT=")[1].split()[0]) for i in (0, 2)]
    assert 290 <= budgets[1] <= budgets[0] <= 300
    # A failed step is recorded and the chain goes on.
    assert _step(project, 1, "step-1.rc").strip() != "0" and _step(project, 2, "step-2.rc").strip() == "0"
    assert "step output of test" in _step(project, 2, "step-2.log")
    assert "chain done" in done.stdout
    assert not (project.parent / "chain" / "repo" / "build").exists()


def test_wait_returns_what_finished_and_a_later_wait_the_rest(project: Path) -> None:
    call = subprocess.Popen(
        ["bash", "ci/gpu/detach.sh", "start", "300", "quick 0", "slow 15"],
        cwd=project,
        env=_env(project),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(3)
    call.kill()  # the call ends; the chain, in its own session, goes on
    call.wait()
    refused = _detach(project, "start", "300", "quick 0")
    assert refused.returncode == 2 and "a chain is running" in refused.stderr
    partial = _detach(project, "wait", "1")
    assert partial.returncode == 1 and "still running" in partial.stdout
    assert sorted(p.name for p in (project.parent / "out").iterdir()) == ["chain.log", "step-0.tgz"]
    rest = _detach(project, "wait", "40")
    assert rest.returncode == 0 and "chain done" in rest.stdout
    assert _step(project, 1, "args.txt").startswith("slow 15 | ")


def test_a_step_with_under_a_minute_left_is_not_started(project: Path) -> None:
    done = _detach(project, "start", "62", "first 3", "second 0")
    assert done.returncode == 0
    assert "step 1 not started" in done.stdout and not (project.parent / "out" / "step-1.tgz").exists()


def test_bad_calls_say_what_to_do(project: Path) -> None:
    assert "usage" in _detach(project, "start", "soon", "bench").stderr
    assert "start one" in _detach(project, "wait").stderr
