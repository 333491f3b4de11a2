"""Project-agnostic git plumbing (cf. Electron's script/lib/git.py).

Everything goes through ``git`` itself (subprocess) with a pinned configuration, so that results do
not depend on a developer's ~/.gitconfig; gitpython is used where reading repository state is all
that is needed.
"""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import git as gitpython

from tools.errors import GitError
from tools.project import IDENT_DATE_GIT, IDENT_EMAIL, IDENT_NAME

logger = logging.getLogger(__name__)

# Options that change what format-patch/apply/am produce. Pinned so a developer's config cannot
# make an export churn (anchors §2: "pinned diff.renames").
PINNED_CONFIG = (
    "diff.renames=true",
    "diff.algorithm=myers",
    "diff.noprefix=false",
    "diff.mnemonicPrefix=false",
    "diff.relative=false",
    "diff.suppressBlankEmpty=false",
    "diff.indentHeuristic=true",
    "format.signature=",
    "format.coverLetter=false",
    "format.numbered=false",
    "core.autocrlf=false",
    "core.safecrlf=false",
    "core.quotePath=true",
    "am.threeWay=false",
    "am.keepcr=true",
    "apply.whitespace=nowarn",
    "commit.gpgSign=false",
    "tag.gpgSign=false",
    "init.defaultBranch=main",
    "advice.detachedHead=false",
    "gc.auto=0",
)

FIXED_IDENT_ENV = {
    "GIT_AUTHOR_NAME": IDENT_NAME,
    "GIT_AUTHOR_EMAIL": IDENT_EMAIL,
    "GIT_AUTHOR_DATE": IDENT_DATE_GIT,
    "GIT_COMMITTER_NAME": IDENT_NAME,
    "GIT_COMMITTER_EMAIL": IDENT_EMAIL,
    "GIT_COMMITTER_DATE": IDENT_DATE_GIT,
}


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


class Git:
    """A repository (or a worktree) driven through the git command line."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    # -- low level ---------------------------------------------------------------------------
    def run(
        self,
        *args: str,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        fixed_ident: bool = False,
    ) -> Result:
        cmd = ["git"]
        for c in PINNED_CONFIG:
            cmd += ["-c", c]
        cmd += list(args)
        full_env = dict(os.environ)
        full_env["LC_ALL"] = "C"
        full_env.pop("GIT_DIR", None)
        full_env.pop("GIT_WORK_TREE", None)
        full_env.pop("GIT_INDEX_FILE", None)
        if fixed_ident:
            full_env.update(FIXED_IDENT_ENV)
        if env:
            full_env.update(env)
        logger.debug(f"git {' '.join(args)} (in {self.path})")
        proc = subprocess.run(
            cmd,
            cwd=self.path,
            env=full_env,
            input=input.encode("utf-8", "surrogateescape") if input is not None else None,
            capture_output=True,
        )
        res = Result(
            proc.returncode,
            proc.stdout.decode("utf-8", "surrogateescape"),
            proc.stderr.decode("utf-8", "surrogateescape"),
        )
        if check and res.returncode != 0:
            raise GitError(
                f"git {' '.join(args)} failed in {self.path} (exit {res.returncode}):\n"
                f"{res.stderr.strip() or res.stdout.strip()}"
            )
        return res

    def out(self, *args: str, **kw: object) -> str:
        return self.run(*args, **kw).stdout.strip()  # type: ignore[arg-type]

    # -- state -------------------------------------------------------------------------------
    @staticmethod
    def init(path: Path) -> "Git":
        path.mkdir(parents=True, exist_ok=True)
        g = Git(path)
        g.run("init", "-q", "-b", "main")
        return g

    def is_repo(self) -> bool:
        return (self.path / ".git").exists()

    def repo(self) -> gitpython.Repo:
        return gitpython.Repo(self.path)

    def rev(self, rev: str) -> str | None:
        r = self.run("rev-parse", "--verify", "-q", f"{rev}^{{commit}}", check=False)
        return r.stdout.strip() if r.returncode == 0 else None

    def head(self) -> str | None:
        return self.rev("HEAD")

    def current_branch(self) -> str | None:
        r = self.run("symbolic-ref", "-q", "--short", "HEAD", check=False)
        return r.stdout.strip() if r.returncode == 0 else None

    def dirty_paths(self) -> list[str]:
        """Uncommitted changes, untracked (non-ignored) files included: a new file is work too."""
        out = self.run("status", "--porcelain", "--untracked-files=all").stdout
        return [line[3:] for line in out.splitlines() if line.strip()]

    def commits(self, base: str, tip: str) -> list[str]:
        """Commits in base..tip, oldest first."""
        out = self.out("rev-list", "--reverse", "--topo-order", f"{base}..{tip}")
        return out.split() if out else []

    def is_ancestor(self, a: str, b: str) -> bool:
        return self.run("merge-base", "--is-ancestor", a, b, check=False).returncode == 0

    def message(self, rev: str) -> str:
        message = self.repo().commit(rev).message
        return message if isinstance(message, str) else message.decode("utf-8", "surrogateescape")

    def subject(self, rev: str) -> str:
        return self.out("log", "-1", "--format=%s", rev)

    def update_ref(self, ref: str, rev: str) -> None:
        self.run("update-ref", ref, rev)

    def show_text(self, rev: str, path: str) -> str | None:
        """A file's text at ``rev`` (bytes that are not UTF-8 survive a round trip); None if absent."""
        data = self.show_file(rev, path)
        return data.decode("utf-8", "surrogateescape") if data is not None else None

    def operation_in_progress(self) -> bool:
        """A `git am` or rebase stopped half-way in this repository."""
        return any((self.path / ".git" / d).exists() for d in ("rebase-apply", "rebase-merge"))

    def show_file(self, rev: str, path: str) -> bytes | None:
        proc = subprocess.run(["git", "cat-file", "blob", f"{rev}:{path}"], cwd=self.path, capture_output=True)
        return proc.stdout if proc.returncode == 0 else None

    def ls_files(self, rev: str) -> list[str]:
        return self.out("ls-tree", "-r", "--name-only", "--full-tree", rev).splitlines()

    def commit_tree_from_dir(self, src: Path, message: str, parent: str | None = None) -> str:
        """Commit the contents of directory ``src`` without touching this repo's index or worktree."""
        index = self.path / ".git" / "tools-import-index"
        env = {"GIT_INDEX_FILE": str(index), "GIT_WORK_TREE": str(src)}
        try:
            self.run("--work-tree", str(src), "add", "-A", "-f", ".", env=env)
            tree = self.out("write-tree", env=env)
        finally:
            index.unlink(missing_ok=True)
        args = ["commit-tree", tree, "-m", message]
        if parent:
            args += ["-p", parent]
        return self.out(*args, fixed_ident=True)

    def worktree_add(self, path: Path, rev: str) -> "Git":
        self.run("worktree", "add", "-f", "--detach", str(path), rev)
        return Git(path)

    def worktree_remove(self, path: Path) -> None:
        self.run("worktree", "remove", "--force", str(path), check=False)
        self.run("worktree", "prune", check=False)

    def am(self, patches: Sequence[Path], *, three_way: bool = False) -> Result:
        args = ["am", "--keep-cr", "--committer-date-is-author-date", "--quiet"]
        if three_way:
            args.append("-3")
        return self.run(*args, *[str(p) for p in patches], check=False, fixed_ident=True)

    def format_patch(self, rev: str) -> str:
        """One commit as ``git format-patch`` writes it, with the project's deterministic flags."""
        return self.run(
            "format-patch",
            "--zero-commit",
            "--full-index",
            "--no-signature",
            "--no-stat",
            "--no-numbered",
            "--encode-email-headers",
            "--no-attach",
            "--no-thread",
            "-U3",
            "--stdout",
            "-1",
            rev,
        ).stdout
