"""Materialise SGLang at a ref as a base commit, laid out like upstream (``python/sglang/...``).

Sources, in order: ``SGLANG_REPO`` (a local clone or mirror), the upstream git remote
(``SGLANG_REMOTE``), then the PyPI release matching a ``vX.Y.Z[.postN]`` tag (sdist, else a wheel)
from ``SGLANG_INDEX_URL``. What was used is pinned in ``sglang.lock``; a later fetch that disagrees
with it is an error, never a silent replacement. Archives are cached under ``.cache/sglang/`` so a
second apply works offline.

The index is the one pip is configured with unless SGLANG_INDEX_URL says otherwise. The release
itself is fetched here rather than by `pip download`: for an sdist, pip first builds its metadata
(seen: "Preparing metadata (pyproject.toml)" for sglang 0.5.9), which installs upstream's build
backend from the index and runs it, and pip does not say which URL it fetched, which the lock records.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from tools.errors import GitError, UpstreamError
from tools.gitutil import Git
from tools.lockfile import LockEntry, known_entry, lock_path_for, record_entry
from tools.project import Project, env_index_url, env_remote, env_repo
from tools.versions import release_version

logger = logging.getLogger(__name__)


# -- PyPI --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Dist:
    filename: str
    url: str
    sha256: str
    kind: str  # "pypi-sdist" | "pypi-wheel"


def pypi_dist(version: str, index_url: str) -> Dist:
    url = f"{index_url}/sglang/"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            data = json.load(r)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise UpstreamError(f"PyPI index {url} cannot be read: {e}") from None
    files = {f["filename"]: f for f in data.get("files", []) if not f.get("yanked")}
    wanted = [(f"sglang-{version}.tar.gz", "pypi-sdist"), (f"sglang-{version}-py3-none-any.whl", "pypi-wheel")]
    wanted += [
        (n, "pypi-wheel")
        for n in sorted(files)
        if n.startswith(f"sglang-{version}-cp311-cp311-manylinux") and n.endswith("_x86_64.whl")
    ]
    for name, kind in wanted:
        if name in files:
            f = files[name]
            return Dist(name, f["url"], f["hashes"]["sha256"], kind)
    raise UpstreamError(f"PyPI index {url} has no sdist or usable wheel for sglang {version}")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _suspects(sha256: str, pinned_in: str | None) -> str:
    return (
        f"; {pinned_in} (field sha256) pins {sha256}. If {pinned_in} was edited, restore it "
        f"(`git checkout {pinned_in}`) or re-pin deliberately with `--relock`"
        if pinned_in
        else f", expected {sha256} (the index's hash)"
    )


def _cached_mismatch(archive: Path, got: str, sha256: str, pinned_in: str | None) -> UpstreamError:
    return UpstreamError(
        f"cached archive {archive} has sha256 {got}{_suspects(sha256, pinned_in)}; if the archive is corrupt "
        "or was replaced, delete it and run again to download it afresh."
    )


def cached_sha256(path: Path) -> str:
    """sha256 of a cached archive, hashed again whenever its size or mtime changed."""
    stat = path.stat()
    stamp = path.with_name(path.name + ".sha256")
    key = f"{stat.st_size} {stat.st_mtime_ns}"
    try:
        recorded_key, digest = stamp.read_text().split("\n")[:2]
        if recorded_key == key:
            return digest
    except (OSError, ValueError):
        pass
    digest = sha256_file(path)
    stamp.write_text(f"{key}\n{digest}\n")
    return digest


def download(url: str, dest: Path, sha256: str, pinned_in: str | None = None) -> Path:
    """Download to the cache (atomically), with progress, and verify the checksum.

    pinned_in: the lock file the checksum comes from (None: the index's own hash), so that a
    mismatch names both suspects."""
    suspects = _suspects(sha256, pinned_in)
    if dest.exists():
        got = cached_sha256(dest)
        if got == sha256:
            logger.info(f"using cached {dest.name}")
            return dest
        raise _cached_mismatch(dest, got, sha256, pinned_in)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # A name of its own: two downloads of one archive never write one file (the rename is atomic).
    fd, tmp_name = tempfile.mkstemp(prefix=dest.name + ".", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    logger.info(f"downloading {url}")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as r:
            total = int(r.headers.get("Content-Length") or 0)
            done, last = 0, -1
            while chunk := r.read(1 << 20):
                out.write(chunk)
                done += len(chunk)
                pct = done * 100 // total if total else -1
                if total and pct // 10 != last // 10:
                    logger.info(f"  {dest.name}: {done >> 20} / {total >> 20} MiB ({pct}%)")
                    last = pct
    except (urllib.error.URLError, OSError) as e:
        tmp.unlink(missing_ok=True)
        raise UpstreamError(f"download of {url} failed: {e}") from None
    got = sha256_file(tmp)
    if got != sha256:
        tmp.unlink(missing_ok=True)
        raise UpstreamError(f"download of {url} has sha256 {got}{suspects}; not using it")
    tmp.replace(dest)
    return dest


def _safe_member(name: str) -> bool:
    p = Path(name)
    return not p.is_absolute() and ".." not in p.parts


def extract(archive: Path, kind: str, version: str, dest: Path) -> None:
    """Lay the archive out like upstream: the sdist root is upstream's ``python/`` folder;
    a wheel's ``sglang/`` goes to ``python/sglang/`` (dist-info and scripts are left out)."""
    py = dest / "python"
    py.mkdir(parents=True)
    try:
        if kind == "pypi-sdist":
            root = f"sglang-{version}/"
            with tarfile.open(archive, "r:gz") as tf:
                for m in tf.getmembers():
                    if not _safe_member(m.name) or not (m.isfile() or m.isdir()):
                        continue
                    if m.name == root.rstrip("/"):
                        continue
                    if not m.name.startswith(root):
                        raise UpstreamError(f"{archive.name}: unexpected member {m.name} outside {root}")
                    m.name = m.name[len(root) :]
                    if m.name:
                        tf.extract(m, py, filter="data")
        else:
            with zipfile.ZipFile(archive) as zf:
                for zi in zf.infolist():
                    if zi.filename.startswith("sglang/") and _safe_member(zi.filename) and not zi.is_dir():
                        zf.extract(zi, py)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as e:
        raise UpstreamError(
            f"archive {archive} is corrupt ({e}). Delete it and run again to download it afresh."
        ) from None
    if not (py / "sglang").is_dir():
        raise UpstreamError(f"archive {archive} has no sglang/ package; it is not an SGLang release")


# -- git sources -------------------------------------------------------------------------------
def fetch_git(repo: Git, url: str, ref: str) -> str:
    """Fetch ``ref`` (tag, branch or commit) from ``url`` into ``repo``; return the commit id."""
    depth = ["--depth=1"] if "://" in url else []  # a full clone of the remote is large
    res = repo.run(
        "fetch",
        "--quiet",
        "--no-tags",
        *depth,
        url,
        f"+{ref}:refs/patches/fetched",
        check=False,
        env={"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true"},
    )
    if res.returncode != 0:
        res2 = repo.run(
            "fetch",
            "--quiet",
            "--no-tags",
            *depth,
            url,
            f"+refs/tags/{ref}:refs/patches/fetched",
            check=False,
            env={"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true"},
        )
        if res2.returncode != 0:
            last = ((res2.stderr or res.stderr).strip().splitlines() or ["failed"])[-1]
            raise UpstreamError(f"git fetch {url} {ref}: {last}")
    commit = repo.rev("refs/patches/fetched")
    if not commit:
        raise UpstreamError(f"git fetch {url} {ref} gave no commit")
    return commit


def _base_message(entry: LockEntry) -> str:
    return f"sglang {entry.ref} (upstream base)\n\nSource: {entry.source}\nURL: {entry.url}\n" + (
        f"SHA256: {entry.sha256}\n" if entry.sha256 else f"Commit: {entry.commit}\n"
    )


def _import_archive(
    project: Project, repo: Git, ref: str, dist: Dist, pinned_in: str | None = None
) -> tuple[str, LockEntry]:
    version = release_version(ref) or ""
    archive = download(dist.url, project.cache_dir / "archives" / dist.filename, dist.sha256, pinned_in)
    entry = LockEntry(ref=ref, source=dist.kind, url=dist.url, sha256=dist.sha256)
    logger.info(f"importing {dist.filename} as the base of {ref}")
    with tempfile.TemporaryDirectory(prefix="sglang-src-", dir=project.cache_dir) as tmp:
        extract(archive, dist.kind, version, Path(tmp))
        base = repo.commit_tree_from_dir(Path(tmp), _base_message(entry))
    return base, LockEntry(**{**asdict(entry), "base_commit": base})


def archive_name(entry: LockEntry) -> str:
    """The archive's file name, as its URL ends (without a #sha256= fragment)."""
    return entry.url.rsplit("/", 1)[-1].split("#")[0]


def lock_problems(entry: LockEntry, repo: Git, lock_name: str) -> list[str]:
    """Fields of a lock entry that contradict each other or the base commit built from it."""
    probs: list[str] = []
    if entry.source == "git":  # its base is upstream's own commit, which records nothing of ours
        return probs
    version = release_version(entry.ref)
    filename = archive_name(entry)
    if not version or not filename.startswith(f"sglang-{version}-") and filename != f"sglang-{version}.tar.gz":
        probs.append(
            f"{lock_name}: ref {entry.ref} and url {entry.url} disagree: the url is not a release "
            f"archive of {entry.ref}"
        )
    if entry.base_commit and repo.rev(entry.base_commit):
        # _base_message wrote these lines when the archive was imported.
        recorded = dict(re.findall(r"^(URL|SHA256): (\S+)$", repo.message(entry.base_commit), re.M))
        for key, field_name, value in (("SHA256", "sha256", entry.sha256), ("URL", "url", entry.url)):
            if key in recorded and recorded[key] != value:
                probs.append(
                    f"{lock_name}: field {field_name} is {value}, but the base commit "
                    f"{entry.base_commit[:12]} was built from {recorded[key]}"
                )
    return probs


def _check_lock(entry: LockEntry, repo: Git, lock_name: str) -> None:
    probs = lock_problems(entry, repo, lock_name)
    if probs:
        raise UpstreamError(
            "\n".join(probs) + f"\n{lock_name} was edited or damaged: restore it (`git checkout {lock_name}`), "
            "or re-pin deliberately with `--relock`."
        )


def _archive_path(project: Project, entry: LockEntry) -> Path:
    return project.cache_dir / "archives" / archive_name(entry)


def _check_cached_archive(project: Project, entry: LockEntry, lock_name: str) -> None:
    """The cached archive still is what the lock pins, though its base commit was built already."""
    archive = _archive_path(project, entry)
    if not entry.sha256 or not archive.is_file():
        return
    got = cached_sha256(archive)
    if got != entry.sha256:
        raise _cached_mismatch(archive, got, entry.sha256, lock_name)


def _from_locked(project: Project, repo: Git, entry: LockEntry, lock_name: str = "sglang.lock") -> str:
    _check_lock(entry, repo, lock_name)
    _check_cached_archive(project, entry, lock_name)
    if entry.source == "git":
        if entry.commit and repo.rev(entry.commit):
            return entry.commit
        errors = []
        for url in [u for u in (env_repo(), entry.url, env_remote()) if u]:
            try:
                commit = fetch_git(repo, url, entry.ref)
            except UpstreamError as e:
                errors.append(str(e))
                continue
            if commit != entry.commit:
                raise UpstreamError(
                    f"{url} has {entry.ref} at {commit}, but {lock_name} pins {entry.commit}: the tag moved "
                    "or this is another repository. Check it; to re-pin deliberately use --relock."
                )
            return commit
        raise UpstreamError(f"cannot fetch locked {entry.describe()}:\n  " + "\n  ".join(errors))
    if entry.base_commit and repo.rev(entry.base_commit):
        return entry.base_commit  # imported (and checksummed) before
    dist = Dist(archive_name(entry), entry.url, entry.sha256 or "", entry.source)
    base, got = _import_archive(project, repo, entry.ref, dist, pinned_in=lock_name)
    if entry.base_commit and base != entry.base_commit:
        raise UpstreamError(
            f"importing {dist.filename} gave base commit {base}, but {lock_name} records "
            f"{entry.base_commit}; the archive layout or the tool's import recipe changed. "
            "Re-pin deliberately with --relock and review the diff."
        )
    return base


def materialise(project: Project, repo: Git, ref: str, *, relock: bool = False) -> tuple[str, LockEntry]:
    """Put the base commit for ``ref`` into ``repo``; return (commit, lock entry)."""
    project.cache_dir.mkdir(parents=True, exist_ok=True)
    entry = None if relock else known_entry(project, ref)
    if entry is not None:
        path = lock_path_for(project, ref)
        # As the user would name it in `git checkout <file>`: relative to the checkout.
        lock_name = str(path.relative_to(project.root)) if path.is_relative_to(project.root) else str(path)
        if env_repo() and entry.source != "git":
            logger.info(f"note: {lock_name} pins {entry.describe()}; SGLANG_REPO is not used (--relock to re-pin)")
        return _from_locked(project, repo, entry, lock_name), entry
    tried: list[str] = []
    for label, url in (("SGLANG_REPO", env_repo()), ("upstream remote", env_remote())):
        if not url:
            tried.append(f"{label}: not set")
            continue
        logger.info(f"fetching {ref} from {url}")
        try:
            commit = fetch_git(repo, url, ref)
        except (UpstreamError, GitError) as e:
            tried.append(f"{label} {url}: {e}")
            continue
        entry = LockEntry(ref=ref, source="git", url=url, commit=commit, base_commit=commit)
        record_entry(project, entry)
        return commit, entry
    version = release_version(ref)
    if not version:
        tried.append(f"PyPI: {ref!r} is not a release tag vX.Y.Z[.postN], so PyPI cannot have it")
    else:
        try:
            dist = pypi_dist(version, env_index_url())
            base, entry = _import_archive(project, repo, ref, dist)
            record_entry(project, entry)
            return base, entry
        except UpstreamError as e:
            tried.append(f"PyPI: {e}")
    raise UpstreamError(
        f"no source has SGLang {ref}. Tried:\n  "
        + "\n  ".join(tried)
        + "\nCheck the ref (tags look like v0.5.9), set SGLANG_REPO to a local clone, or check the network."
    )
