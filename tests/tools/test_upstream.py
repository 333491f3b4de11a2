"""Upstream sources: a local fake PyPI (real HTTP, real tar/zip archives) and real git repos."""

import hashlib
import http.server
import io
import json
import tarfile
import threading
import zipfile
from pathlib import Path
from typing import Iterator

import pytest

from tools.cli import main

from conftest import UNREACHABLE_INDEX, UPSTREAM_FILES, git, make_upstream


def sdist_bytes(version: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for rel, text in UPSTREAM_FILES.items():
            data = text.encode()
            ti = tarfile.TarInfo(f"sglang-{version}/" + rel.removeprefix("python/"))
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def wheel_bytes() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for rel, text in UPSTREAM_FILES.items():
            if rel.startswith("python/sglang/"):
                zf.writestr(rel.removeprefix("python/"), text)
        zf.writestr("sglang-2.0.0.dist-info/METADATA", "Name: sglang\n")
    return buf.getvalue()


class FakeIndex:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.claimed_sha: dict[str, str] = {}
        self.hits: list[str] = []
        idx = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                idx.hits.append(self.path)
                if self.path == "/simple/sglang/":
                    body = json.dumps(
                        {
                            "files": [
                                {
                                    "filename": n,
                                    "url": f"{idx.url}/files/{n}",
                                    "hashes": {"sha256": idx.claimed_sha.get(n) or hashlib.sha256(d).hexdigest()},
                                }
                                for n, d in idx.files.items()
                            ]
                        }
                    ).encode()
                elif self.path.startswith("/files/") and self.path[7:] in idx.files:
                    body = idx.files[self.path[7:]]
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeIndex]:
    idx = FakeIndex()
    idx.files["sglang-1.0.0.tar.gz"] = sdist_bytes("1.0.0")
    idx.files["sglang-2.0.0-cp311-cp311-manylinux_2_34_x86_64.whl"] = wheel_bytes()
    monkeypatch.setenv("SGLANG_INDEX_URL", idx.url + "/simple")
    yield idx
    idx.server.shutdown()


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "patches").mkdir(parents=True)
    (root / "series").write_text("")
    return root


def tool(root: Path, *args: str) -> int:
    return main(["--root", str(root), *args])


def test_pypi_sdist_laid_out_like_upstream_and_locked(
    proj: Path, index: FakeIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tool(proj, "--ref", "v1.0.0", "apply") == 0
    tree = proj / "build" / "sglang-v1.0.0"
    assert (tree / "python/sglang/srt/server_args.py").read_text() == UPSTREAM_FILES["python/sglang/srt/server_args.py"]
    assert (tree / "python/pyproject.toml").exists()
    lock = json.loads((proj / "sglang.lock").read_text())
    assert lock["ref"] == "v1.0.0" and lock["source"] == "pypi-sdist"
    assert lock["sha256"] == hashlib.sha256(index.files["sglang-1.0.0.tar.gz"]).hexdigest()
    assert (proj / ".cache/sglang/archives/sglang-1.0.0.tar.gz").exists()
    # second apply works offline: index gone, archive cached
    monkeypatch.setenv("SGLANG_INDEX_URL", UNREACHABLE_INDEX)
    import shutil

    shutil.rmtree(tree)
    assert tool(proj, "apply") == 0
    assert json.loads((proj / "sglang.lock").read_text())["base_commit"] == git(tree, "rev-parse", "refs/patches/base")


def test_wheel_only_release(proj: Path, index: FakeIndex) -> None:
    assert tool(proj, "--ref", "v2.0.0", "apply") == 0
    tree = proj / "build" / "sglang-v2.0.0"
    assert (tree / "python/sglang/__init__.py").exists()
    assert not list(tree.glob("python/*.dist-info"))
    assert json.loads((proj / "sglang.lock").read_text())["source"] == "pypi-wheel"


def test_unknown_ref_names_everything_tried(proj: Path, index: FakeIndex, capsys: pytest.CaptureFixture[str]) -> None:
    assert tool(proj, "--ref", "v9.9.9", "apply") == 1
    err = capsys.readouterr().err
    assert "no source has SGLang v9.9.9. Tried:" in err
    assert "SGLANG_REPO: not set" in err
    assert "upstream remote /nonexistent/sglang.git" in err
    assert "has no sdist or usable wheel for sglang 9.9.9" in err
    assert not (proj / "build" / "sglang-v9.9.9").exists()


def test_non_version_ref_not_looked_up_on_pypi(proj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tool(proj, "--ref", "main", "apply") == 1
    assert "'main' is not a release tag vX.Y.Z[.postN], so PyPI cannot have it" in capsys.readouterr().err


def test_no_network_and_no_pypi(proj: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tool(proj, "--ref", "v1.0.0", "apply") == 1
    err = capsys.readouterr().err
    assert f"PyPI: PyPI index {UNREACHABLE_INDEX}/sglang/ cannot be read" in err
    assert "set SGLANG_REPO to a local clone, or check the network" in err


def test_checksum_mismatch_from_index(proj: Path, index: FakeIndex, capsys: pytest.CaptureFixture[str]) -> None:
    index.claimed_sha["sglang-1.0.0.tar.gz"] = "0" * 64
    assert tool(proj, "--ref", "v1.0.0", "apply") == 1
    err = capsys.readouterr().err
    assert "expected " + "0" * 64 + " (the index's hash); not using it" in err
    assert not (proj / ".cache/sglang/archives/sglang-1.0.0.tar.gz").exists()
    assert not (proj / "sglang.lock").exists()


def test_cached_archive_replaced_disagrees_with_lock(
    proj: Path, index: FakeIndex, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tool(proj, "--ref", "v1.0.0", "apply") == 0
    import shutil

    shutil.rmtree(proj / "build")
    cached = proj / ".cache/sglang/archives/sglang-1.0.0.tar.gz"
    cached.write_bytes(cached.read_bytes()[:100])  # truncated download / disk corruption
    if (proj / ".cache/sglang/repo").exists():
        shutil.rmtree(proj / ".cache/sglang/repo")
    assert tool(proj, "apply") == 1
    err = capsys.readouterr().err
    assert "cached archive" in err and "if the archive is corrupt or was replaced, delete it and run again" in err


def _edit_lock(proj: Path, **fields: str) -> None:
    lock = json.loads((proj / "sglang.lock").read_text())
    (proj / "sglang.lock").write_text(json.dumps({**lock, **fields}, indent=2) + "\n")


WRONG_SHA = "0" * 63 + "1"


def test_a_wrong_sha256_in_the_lock_is_named_as_such(
    proj: Path, index: FakeIndex, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    assert tool(proj, "--ref", "v1.0.0", "apply") == 0
    good = json.loads((proj / "sglang.lock").read_text())["sha256"]
    _edit_lock(proj, sha256=WRONG_SHA)
    # With the tree present, apply still checks the lock against the base commit it built.
    assert tool(proj, "apply") == 1
    err = capsys.readouterr().err
    assert f"sglang.lock: field sha256 is {WRONG_SHA}, but the base commit" in err and good in err
    assert "restore it (`git checkout sglang.lock`), or re-pin deliberately with `--relock`" in err
    # Without it, the cached archive is compared with the lock: both are named.
    shutil.rmtree(proj / "build")
    assert tool(proj, "apply") == 1
    err = capsys.readouterr().err
    assert f"has sha256 {good}; sglang.lock (field sha256) pins {WRONG_SHA}" in err
    # And a fresh download too.
    (proj / ".cache/sglang/archives/sglang-1.0.0.tar.gz").unlink()
    assert tool(proj, "apply") == 1
    err = capsys.readouterr().err
    assert f"download of {index.url}" in err and f"sglang.lock (field sha256) pins {WRONG_SHA}" in err


def test_a_lock_whose_ref_and_url_disagree(proj: Path, index: FakeIndex, capsys: pytest.CaptureFixture[str]) -> None:
    assert tool(proj, "--ref", "v1.0.0", "apply") == 0
    _edit_lock(proj, ref="v1.0.99")
    assert tool(proj, "apply") == 1
    err = capsys.readouterr().err
    assert "sglang.lock: ref v1.0.99 and url " in err and "sglang-1.0.0.tar.gz disagree" in err


def test_corrupt_archive(proj: Path, index: FakeIndex, capsys: pytest.CaptureFixture[str]) -> None:
    index.files["sglang-1.0.0.tar.gz"] = b"this is not gzip"
    assert tool(proj, "--ref", "v1.0.0", "apply") == 1
    assert "is corrupt" in capsys.readouterr().err


def test_git_lock_mismatch_is_an_error(
    tmp_path: Path, proj: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    up = make_upstream(tmp_path / "up")
    monkeypatch.setenv("SGLANG_REPO", str(up))
    assert tool(proj, "--ref", "v1.0.0", "apply") == 0
    assert json.loads((proj / "sglang.lock").read_text())["source"] == "git"
    # the tag is moved upstream; a fresh tree must not silently use the new commit
    (up / "python/sglang/__init__.py").write_text("moved\n")
    git(up, "commit", "-qam", "moved")
    git(up, "tag", "-f", "v1.0.0")
    assert tool(proj, "--tree", str(tmp_path / "fresh"), "apply") == 1
    assert "but sglang.lock pins" in capsys.readouterr().err


def test_the_users_pip_index_is_used(
    proj: Path, index: FakeIndex, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without SGLANG_INDEX_URL, the index pip is configured with (a mirror, say) serves the release."""
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nindex-url = {index.url}/simple\n")
    monkeypatch.delenv("SGLANG_INDEX_URL")
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    assert tool(proj, "--ref", "v1.0.0", "apply") == 0
    assert json.loads((proj / "sglang.lock").read_text())["url"].startswith(index.url)


def test_a_replaced_archive_is_caught_with_the_tree_present(
    proj: Path, index: FakeIndex, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tool(proj, "--ref", "v1.0.0", "apply") == 0
    assert tool(proj, "apply") == 0  # the tree and its base commit are there: nothing is downloaded again
    cached = proj / ".cache/sglang/archives/sglang-1.0.0.tar.gz"
    cached.write_bytes(cached.read_bytes()[:100])
    assert tool(proj, "apply") == 1
    err = capsys.readouterr().err
    assert f"cached archive {cached} has sha256" in err and "pins" in err and "delete it and run again" in err


def test_a_lines_lock_is_named_by_its_path(proj: Path, index: FakeIndex, capsys: pytest.CaptureFixture[str]) -> None:
    line = proj / "lines" / "v1.0.0"
    (line / "patches").mkdir(parents=True)
    (line / "series").write_text("")
    assert tool(proj, "--ref", "v1.0.0", "apply") == 0
    lock = json.loads((line / "sglang.lock").read_text())
    (line / "sglang.lock").write_text(json.dumps({**lock, "sha256": WRONG_SHA}, indent=2) + "\n")
    assert tool(proj, "--ref", "v1.0.0", "apply") == 1
    err = capsys.readouterr().err
    assert "restore it (`git checkout lines/v1.0.0/sglang.lock`)" in err, err
