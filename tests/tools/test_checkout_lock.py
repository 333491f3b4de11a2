"""One toolkit run at a time per checkout: a second is refused with the holder named, concurrent
first applies leave one clean tree, downloads never share a file, and a killed run's scratch is
swept by the next run."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tools.checkout_lock import hold
from tools.project import Project
from tools.upstream import download

from conftest import REAL_ROOT, Env, git


def test_a_second_run_is_refused_naming_the_first(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    head = git(env.tree, "rev-parse", "HEAD")
    with hold(env.project, "make apply (the first)"):
        assert env.tool("apply") == 1
        assert env.tool("check") == 1
    err = capsys.readouterr().err
    assert f"another toolkit run (pid {os.getpid()}, make apply (the first)) is using" in err
    assert "nothing was changed" in err
    assert git(env.tree, "rev-parse", "HEAD") == head
    assert env.tool("apply") == 0  # released with the command


def test_concurrent_first_applies_leave_one_clean_tree(tmp_path: Path, env: Env) -> None:
    root = tmp_path / "fresh"
    (root / "patches").mkdir(parents=True)
    (root / "series").write_text("")
    (root / "sglang.lock").write_text((env.root / "sglang.lock").read_text())
    cmd = [sys.executable, "-m", "tools", "--root", str(root), "apply"]
    procs = [
        subprocess.Popen(
            cmd,
            cwd=REAL_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REAL_ROOT)},
        )
        for _ in range(3)
    ]
    results = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
    assert any(rc == 0 for rc, _ in results), results
    for rc, err in results:
        assert rc == 0 or "another toolkit run" in err, err
    tree = root / "build" / "sglang-v1.0.0"
    assert sorted(p.name for p in tree.iterdir()) == [".git", "python"]  # no second repository inside it
    assert git(tree, "status", "--porcelain") == ""
    assert not list((root / "build").glob(".apply-*"))


def test_a_killed_runs_scratch_is_swept(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    left = [
        env.root / "build" / ".apply-x1y2",
        env.root / ".cache" / "sglang" / "sglang-src-abc",
        env.root / ".cache" / "sglang" / "archives" / "sglang-1.0.0.tar.gz.k3j.part",
    ]
    for p in left[:2]:
        (p / "tree").mkdir(parents=True)
    left[2].parent.mkdir(parents=True, exist_ok=True)
    left[2].write_bytes(b"half an archive")
    assert env.tool("apply") == 0
    assert not any(p.exists() for p in left)
    assert "removed 3 temporary file(s) or folder(s) an interrupted run left" in capsys.readouterr().err


def test_downloads_of_one_archive_at_once_share_no_file(tmp_path: Path) -> None:
    archive = tmp_path / "sglang-9.9.9.tar.gz"
    archive.write_bytes(os.urandom(3 << 20))
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    dest = tmp_path / "cache" / archive.name
    errors: list[BaseException] = []

    def fetch() -> None:
        try:
            download(archive.as_uri(), dest, sha)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=fetch) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert dest.read_bytes() == archive.read_bytes()
    assert not list(dest.parent.glob("*.part"))


def test_unwritable_checkout_is_a_message_not_a_traceback(
    env: Env, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    build = env.root / "build"
    if os.geteuid() == 0:
        # root writes anywhere: have the first write into build/ fail as it does for a user without rights.
        real_open = Path.open

        def refuse(self: Path, *args: object, **kwargs: object):
            if self.parent == build:
                raise PermissionError(13, "Permission denied", str(self))
            return real_open(self, *args, **kwargs)  # type: ignore[call-overload]

        monkeypatch.setattr(Path, "open", refuse)
    else:
        build.chmod(0o555)
    try:
        assert env.tool("apply") == 1
    finally:
        build.chmod(0o755)
    err = capsys.readouterr().err
    assert "cannot write" in err and "permission denied" in err and "Traceback" not in err


def test_the_lock_lives_in_build(tmp_path: Path) -> None:
    project = Project(tmp_path)
    with hold(project, "x"):
        assert (tmp_path / "build" / ".tools.lock").read_text() == f"pid {os.getpid()}, x\n"
    assert (tmp_path / "build" / ".tools.lock").read_text() == ""
