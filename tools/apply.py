"""Build the patched tree: base commit, then one commit per patch in series order.

Every hunk is classified in memory first (``hunkcheck``); git am runs only when all of them pass,
in a throw-away worktree, and the tree's branch moves to the result only when every patch went in,
so a failed apply never leaves a half-applied tree presented as good (gbp pq's all-or-nothing).
"""

from __future__ import annotations

import datetime as _dt
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tools.errors import ApplyError, PatchParseError, SeriesError, UnsafeTreeError
from tools.gitutil import Git
from tools.hunkcheck import HunkStatus, PatchResult, TreeState, check_series
from tools.lockfile import LockEntry, pinned_ref
from tools.patchfile import Patch, index_problems, read_patch, requirement_problems
from tools.progress import Counter
from tools.project import Project
from tools.series import SeriesProblemKind, read_series, series_problems
from tools.upstream import materialise

logger = logging.getLogger(__name__)

TREE_BRANCH = "patched"
BASE_REF = "refs/patches/base"
APPLIED_REF = "refs/patches/applied"
TREE_EXCLUDES = "__pycache__/\n*.pyc\n*.egg-info/\n/python/build/\n.pytest_cache/\n"


@dataclass(frozen=True)
class SeriesPatch:
    path: Path
    patch: Patch


@dataclass(frozen=True)
class ApplyOutcome:
    tree: Path
    ref: str
    base: str
    head: str
    entry: LockEntry
    results: tuple[PatchResult, ...]
    backup: str | None


def resolve_ref(project: Project, ref: str | None) -> str:
    ref = ref or pinned_ref(project)
    if not ref:
        raise SeriesError("no SGLANG_REF given and sglang.lock pins none; run e.g. `make apply SGLANG_REF=v0.5.9`")
    return ref


@dataclass(frozen=True)
class LoadedSeries:
    patches: tuple[SeriesPatch, ...]  # those that can be checked: in series order, up to the first unreadable
    problems: tuple[str, ...]  # series, file and header problems, in the order found
    unchecked: tuple[str, ...] = ()  # readable patches after an unreadable one

    def unchecked_note(self) -> str | None:
        if not self.unchecked:
            return None
        return (
            f"{len(self.unchecked)} later patch(es) not checked against the tree ({', '.join(self.unchecked)}): "
            "they build on a patch that could not be read; fix that one first"
        )


def read_series_patches(project: Project, *, strict_unused: bool = False, headers: bool = False) -> LoadedSeries:
    """Parse the whole series and collect every problem found on the way, raising none."""
    series = read_series(project.series_path)
    problems: list[str] = []
    for p in series_problems(series, project.patches_dir):
        if p.kind is SeriesProblemKind.UNUSED and not strict_unused:
            logger.warning(str(p))
        else:
            problems.append(str(p))
    out: list[SeriesPatch] = []
    unchecked: list[str] = []
    seen: set[str] = set()
    blocked = False  # an earlier patch is missing or unreadable
    for e in series.entries:
        path = project.patches_dir / e.name
        if e.name in seen:  # reported above; applying it twice would only add noise
            continue
        seen.add(e.name)
        try:
            patch = read_patch(path, e.name) if path.is_file() else None
        except PatchParseError as err:
            problems.append(str(err))
            patch = None
        if headers and patch:
            problems.extend(patch.header_problems())
        if patch:
            problems.extend(index_problems(patch))
        # Past an unreadable patch, the tree every later hunk meets is unknown: a healthy patch would
        # read as an offset or a conflict. Those are parsed, not checked against the tree.
        if patch is None or blocked:
            blocked = True
            if patch is not None:
                unchecked.append(e.name)
            continue
        out.append(SeriesPatch(path, patch))
    problems.extend(requirement_problems([sp.patch for sp in out], series.names))
    return LoadedSeries(tuple(out), tuple(problems), tuple(unchecked))


def load_patches(project: Project, *, strict_unused: bool = False) -> list[SeriesPatch]:
    """The whole series, parsed; every problem at once as one error."""
    loaded = read_series_patches(project, strict_unused=strict_unused)
    if loaded.problems:
        raise SeriesError("\n".join(loaded.problems))
    return list(loaded.patches)


def classify(repo: Git, base: str, patches: list[Patch]) -> list[PatchResult]:
    return check_series(patches, TreeState(lambda path: repo.show_text(base, path)))


def hunk_problems(results: list[PatchResult], allow_offset: bool) -> list[str]:
    return [h.describe() for r in results for h in r.problems(allow_offset)]


def failure_summary(results: list[PatchResult], ref: str, allow_offset: bool) -> str | None:
    bad = [r for r in results if r.problems(allow_offset)]
    if not bad:
        return None
    offsets = any(h.status is HunkStatus.OFFSET for r in bad for h in r.hunks)
    hint = " (offsets are refused by default; --allow-offset accepts them)" if offsets and not allow_offset else ""
    damaged = [r.patch for r in bad if r.status is HunkStatus.DAMAGED]
    return (
        f"{len(bad)} of {len(results)} patch(es) do not apply exactly at {ref}: "
        + ", ".join(r.patch for r in bad)
        + hint
        + (f"; damaged: {', '.join(damaged)}" if damaged else "")
    )


def tree_problems(repo: Git) -> list[str]:
    """Work in the tree that re-applying would throw away."""
    probs = []
    if repo.operation_in_progress():
        probs.append("a `git am` or rebase is in progress (finish it with `git am --continue` or `git am --abort`)")
    dirty = repo.dirty_paths()
    if dirty:
        shown = ", ".join(dirty[:5]) + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else "")
        probs.append(f"uncommitted changes: {shown}")
    head = repo.head()
    applied = repo.rev(APPLIED_REF)
    if head and not applied:
        probs.append(f"no {APPLIED_REF}: this tree was not built by the tool, so its commits cannot be checked")
    elif head and applied and head != applied:
        extra = repo.commits(applied, head)
        if extra:
            probs.append(f"{len(extra)} commit(s) not in the series: " + ", ".join(repo.subject(c) for c in extra[:5]))
        else:
            probs.append(
                f"HEAD {head[:12]} is not the applied series {applied[:12]} (commits rewritten or another branch checked out)"
            )
    return probs


def save_backup(repo: Git) -> str:
    """Save HEAD plus any uncommitted work on a new branch, without touching the worktree."""
    name = "backup/" + _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    head = repo.head()
    commit = head
    if repo.dirty_paths():
        index = repo.path / ".git" / "tools-backup-index"
        env = {"GIT_INDEX_FILE": str(index)}
        try:
            if head:
                repo.run("read-tree", head, env=env)
            repo.run("add", "-A", env=env)
            tree = repo.out("write-tree", env=env)
        finally:
            index.unlink(missing_ok=True)
        args = ["commit-tree", tree, "-m", "uncommitted changes saved by `apply FORCE=1`"]
        if head:
            args += ["-p", head]
        commit = repo.out(*args, fixed_ident=True)  # works without a configured git identity
    if commit:
        repo.run("branch", "-f", name, commit)
    return name


def unsafe_message(tree: Path, probs: list[str]) -> str:
    return (
        f"{tree} holds work that applying would discard:\n  - "
        + "\n  - ".join(probs)
        + "\nTo keep it: commit it in the tree and run `make refresh` (it becomes patches), then apply."
        + "\nTo set it aside: `make apply FORCE=1` saves it on a backup/<date> branch in the tree first."
    )


def _git_am_each(wt: Git, patches: list[SeriesPatch]) -> None:
    counter = Counter(len(patches), "applying")
    for sp in patches:
        counter.step(sp.path.name)
        res = wt.am([sp.path])
        if res.returncode != 0:
            wt.run("am", "--abort", check=False)
            raise ApplyError(
                f"git am rejected {sp.path.name} although every hunk was classified as applying:\n"
                f"{(res.stderr or res.stdout).strip()}\nNothing was changed in the tree."
            )


def build_commits(repo: Git, base: str, patches: list[SeriesPatch], scratch: Path) -> str:
    """Apply in a detached worktree; return the resulting head. The tree's checkout is untouched."""
    wt_path = scratch / "apply-worktree"
    wt = repo.worktree_add(wt_path, base)
    try:
        _git_am_each(wt, patches)
        return wt.head() or base
    finally:
        repo.worktree_remove(wt_path)


def point_tree_at(repo: Git, ref: str, base: str, head: str) -> None:
    repo.update_ref(BASE_REF, base)
    repo.run("tag", "-f", f"upstream/{ref}", base)
    repo.run("checkout", "-q", "-f", "-B", TREE_BRANCH, head)
    repo.run("clean", "-q", "-fd")
    repo.update_ref(APPLIED_REF, head)


def _move_into_place(built: Path, tree: Path) -> None:
    if tree.exists():  # made meanwhile by something outside the toolkit's lock
        raise UnsafeTreeError(
            f"{tree} appeared while the series was being applied; nothing was moved "
            "into it: look at what made it, then run again"
        )
    tree.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(built), str(tree))


def apply_series(
    project: Project,
    ref: str | None = None,
    tree: Path | None = None,
    *,
    allow_offset: bool = False,
    force: bool = False,
    relock: bool = False,
) -> ApplyOutcome:
    ref = resolve_ref(project, ref)
    tree = tree or project.tree_for(ref)
    loaded = read_series_patches(project)
    patches = list(loaded.patches)
    project.build_dir.mkdir(parents=True, exist_ok=True)
    backup = None
    fresh = not tree.exists()
    if not fresh:
        if not Git(tree).is_repo():
            raise UnsafeTreeError(f"{tree} exists but is not a git repository made by this tool; move it away")
        repo = Git(tree)
        probs = tree_problems(repo)
        if probs and not force:
            raise UnsafeTreeError(unsafe_message(tree, probs))
        if probs:
            backup = save_backup(repo)
            logger.info(f"saved the tree's work on branch {backup} (in {tree})")
    with tempfile.TemporaryDirectory(prefix=".apply-", dir=project.build_dir) as scratch_s:
        scratch = Path(scratch_s)
        if fresh:
            repo = Git.init(scratch / "tree")
            (repo.path / ".git" / "info").mkdir(parents=True, exist_ok=True)
            (repo.path / ".git" / "info" / "exclude").write_text(TREE_EXCLUDES)
        base, entry = materialise(project, repo, ref, relock=relock)
        logger.info(f"checking {len(patches)} patch(es) hunk by hunk against {ref}")
        results = classify(repo, base, [sp.patch for sp in patches])
        for r in results:
            logger.info(f"  {r.patch}: {r.status.value} ({r.summary()})")
        problems = [*loaded.problems, *hunk_problems(results, allow_offset)]
        if problems:
            failed = failure_summary(results, ref, allow_offset)
            series = f"{len(loaded.problems)} series/file problem(s)" if loaded.problems else ""
            summary = "; ".join(part for part in (series, failed, loaded.unchecked_note()) if part)
            raise ApplyError(
                "\n".join([*problems, summary]) + ("\nNo tree was created." if fresh else f"\n{tree} was not changed.")
            )
        head = build_commits(repo, base, patches, scratch)
        point_tree_at(repo, ref, base, head)
        if fresh:
            _move_into_place(repo.path, tree)
    return ApplyOutcome(tree, ref, base, head, entry, tuple(results), backup)
