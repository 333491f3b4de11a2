"""Refresh: write the tree's commits back to ``patches/`` deterministically.

The target is ``git format-patch --zero-commit --full-index --no-signature --no-stat --no-numbered``
output with From/Date set to constants and the message/diff separator written as ``---`` (what
format-patch writes when a stat is present), so re-exporting an unchanged patch is a byte-for-byte
no-op and headers survive refresh: the header *is* the commit message.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from tools.apply import APPLIED_REF, BASE_REF
from tools.errors import PatchParseError, SeriesError, ToolError
from tools.gitutil import Git
from tools.patchfile import parse_patch_text, read_patch
from tools.project import IDENT_DATE, IDENT_EMAIL, IDENT_NAME, Project
from tools.series import append_to_series, read_series

logger = logging.getLogger(__name__)

_FROM_RE = re.compile(r"^From: .*(\n[ \t].*)*$", re.M)
_DATE_RE = re.compile(r"^Date: .*$", re.M)


def canonical(text: str) -> str:
    """Normalise one format-patch mail: constant author/date, ``---`` before the diff."""
    m = re.search(r"^diff --git ", text, re.M)
    if not m:
        raise ToolError("format-patch produced no diff (is the commit empty?)")
    head, diff = text[: m.start()], text[m.start() :]
    end_of_mail_headers = head.find("\n\n")
    mail, body = head[: end_of_mail_headers + 1], head[end_of_mail_headers + 1 :]
    mail = _FROM_RE.sub(lambda _: f"From: {IDENT_NAME} <{IDENT_EMAIL}>", mail, count=1)
    mail = _DATE_RE.sub(lambda _: f"Date: {IDENT_DATE}", mail, count=1)
    if body.endswith("\n\n"):
        body = body[:-1] + "---\n"
    elif not body.endswith("---\n"):
        body += "---\n"
    return mail + body + diff


def export_commit(repo: Git, commit: str) -> str:
    if not repo.run("diff-tree", "--quiet", f"{commit}^", commit, check=False).returncode:
        raise ToolError(f"commit {commit[:12]} ({repo.subject(commit)}) changes nothing; drop it or squash it")
    return canonical(repo.format_patch(commit))


def slug(subject: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", subject.lower()).strip("-")
    return (s[:60].rstrip("-") or "patch") + ".patch"


def _next_number(series_names: list[str]) -> int | None:
    """The number a new patch takes when the series numbers its patches (0001-...), else None."""
    numbers = [re.match(r"(\d{4})-", n) for n in series_names]
    if not series_names or not all(numbers):
        return None
    return max(int(m.group(1)) for m in numbers if m) + 1


@dataclass(frozen=True)
class ExportOutcome:
    written: tuple[str, ...]
    unchanged: tuple[str, ...]
    added: tuple[str, ...]


def _match_names(repo: Git, commits: list[str], series_names: list[str], project: Project) -> list[str | None]:
    """Patch file for each commit: same Subject first (survives reordering), else same position."""
    subjects: dict[str, str] = {}
    for n in series_names:
        try:
            subjects.setdefault(read_patch(project.patches_dir / n, n).subject, n)
        except PatchParseError:
            pass
    names: list[str | None] = []
    used: set[str] = set()
    for c in commits:
        same = subjects.get(repo.subject(c))
        names.append(same if same and same not in used else None)
        if same:
            used.add(same)
    for i, matched in enumerate(names):
        if matched is None and i < len(series_names) and series_names[i] not in used:
            names[i] = series_names[i]
            used.add(series_names[i])
    return names


def _edited_since_sync(repo: Git, base: str, project: Project, series_names: list[str]) -> list[str]:
    """Patch files that differ from what the tree held when it was last applied or refreshed."""
    synced = repo.rev(APPLIED_REF)
    if not synced or not repo.is_ancestor(base, synced):
        return []
    commits = repo.commits(base, synced)
    on_disk = [
        (c, project.patches_dir / n)
        for c, n in zip(commits, _match_names(repo, commits, series_names, project), strict=False)
        if n and (project.patches_dir / n).is_file()
    ]
    return reexport_diff(repo, [c for c, _ in on_disk], [p for _, p in on_disk])


def _count_hunks(text: str) -> int:
    return sum(1 for ln in text.split("\n") if ln.startswith("@@ -"))


def _hunk_change(on_disk: Path, export: str) -> str:
    """What FORCE=1 would do to the file's hunks; a lost hunk is lost work."""
    have = _count_hunks(on_disk.read_text(encoding="utf-8", errors="surrogateescape"))
    tree = _count_hunks(export)
    if tree < have:
        effect = f"FORCE=1 would lose {have - tree} hunk(s)"
    elif tree > have:
        effect = f"FORCE=1 writes the tree's {tree}"
    else:
        effect = "same number of hunks; their text differs"
    return f"the file has {have} hunk(s), the tree's commit {tree} ({effect})"


def export_tree(project: Project, tree: Path, force: bool = False) -> ExportOutcome:
    """Write the tree's commits to patches/. Refuses (unless force) to overwrite a patch file edited
    since the last apply or refresh, which the tree does not hold."""
    repo = Git(tree)
    base, head, commits = _linear_commits(repo, tree)
    series_names = read_series(project.series_path).names
    names = _match_names(repo, commits, series_names, project)
    _check_against_series(names, series_names)
    edited = _edited_since_sync(repo, base, project, series_names)
    if edited and not force:
        _refuse_edited(project, repo, edited, dict(zip(names, commits, strict=False)))
    dirty = repo.dirty_paths()
    if dirty:
        logger.warning(f"uncommitted changes in {tree} are not exported: {', '.join(dirty[:5])}")
    outcome = _write_patches(project, repo, commits, names, series_names)
    if outcome.added:
        append_to_series(project.series_path, list(outcome.added))
    repo.update_ref(APPLIED_REF, head)
    return outcome


def _linear_commits(repo: Git, tree: Path) -> tuple[str, str, list[str]]:
    """The base, the head and the commits between them of a tree `make apply` built."""
    if not repo.is_repo() or not repo.rev(BASE_REF):
        raise ToolError(f"{tree} is not a tree built by `make apply` (no {BASE_REF}); run `make apply` first")
    if repo.operation_in_progress():
        raise ToolError(f"a git am/rebase is in progress in {tree}; finish or abort it before refreshing")
    base = repo.rev(BASE_REF) or ""
    head = repo.head() or base
    if not repo.is_ancestor(base, head):
        raise ToolError(f"HEAD of {tree} does not descend from {BASE_REF}; check out the `patched` branch")
    commits = repo.commits(base, head)
    if any(len(repo.out("rev-list", "--parents", "-1", c).split()) > 2 for c in commits):
        raise ToolError("the tree's history has merge commits; a series is linear: rebase them away first")
    return base, head, commits


def _check_against_series(names: list[str | None], series_names: list[str]) -> None:
    unmatched = [n for n in series_names if n not in names]
    if unmatched:
        raise SeriesError(
            "series entries with no commit in the tree: "
            + ", ".join(unmatched)
            + "\nIf you dropped them on purpose, remove them from series and delete the files; "
            "otherwise re-apply (`make apply`) and redo your change. Nothing was written."
        )
    order = [n for n in names if n]
    if order != [n for n in series_names if n in order]:
        raise SeriesError(
            "the tree's commits are in a different order than series: reorder the lines in series to "
            f"match ({', '.join(order)}) and run refresh again. Nothing was written."
        )


def _refuse_edited(project: Project, repo: Git, edited: list[str], by_name: dict[str | None, str]) -> None:
    raise ToolError(
        "patch files edited since the tree was last applied or refreshed: "
        + ", ".join(edited)
        + "".join(
            f"\n  {n}: " + _hunk_change(project.patches_dir / n, export_commit(repo, by_name[n]))
            for n in edited
            if n in by_name
        )
        + "\nRefreshing would overwrite those edits with the tree's commits. Put the edit in the tree "
        "(a header: `git commit --amend` there; or `make apply FORCE=1` to rebuild the tree from "
        "patches/), or refresh with FORCE=1 to discard it. Nothing was written."
    )


def _write_patches(
    project: Project, repo: Git, commits: list[str], names: list[str | None], series_names: list[str]
) -> ExportOutcome:
    """Each commit's patch text into patches/: under its series name, or a new numbered one."""
    texts = [export_commit(repo, c) for c in commits]
    written, unchanged, added = [], [], []
    taken = set(series_names) | {p.name for p in project.patches_dir.glob("*.patch")}
    project.patches_dir.mkdir(parents=True, exist_ok=True)
    next_number = _next_number(series_names)
    for c, name, text in zip(commits, names, texts, strict=False):
        if name is None:
            name, next_number = _new_name(slug(repo.subject(c)), next_number, taken)
            added.append(name)
        for prob in parse_patch_text(text, name).header_problems():
            logger.warning(f"{prob} (edit the commit message: `git commit --amend` in the tree)")
        path = project.patches_dir / name
        if path.exists() and path.read_bytes() == text.encode("utf-8", "surrogateescape"):
            unchanged.append(name)
            continue
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        written.append(name)
    return ExportOutcome(tuple(written), tuple(unchanged), tuple(added))


def _new_name(base_name: str, next_number: int | None, taken: set[str]) -> tuple[str, int | None]:
    """A file name for a commit series does not know yet (numbered after the last entry when
    series numbers its patches), unique among taken, which it joins."""
    if next_number is not None:
        base_name, next_number = f"{next_number:04d}-{base_name}", next_number + 1
    name, k = base_name, 2
    while name in taken:
        name = base_name[: -len(".patch")] + f"-{k}.patch"
        k += 1
    taken.add(name)
    return name, next_number


def reexport_diff(repo: Git, commits: list[str], paths: list[Path]) -> list[str]:
    """Names of patches whose re-export from ``commits`` would change their file."""
    changed = []
    for c, p in zip(commits, paths, strict=False):
        if p.read_bytes() != export_commit(repo, c).encode("utf-8", "surrogateescape"):
            changed.append(p.name)
    return changed
