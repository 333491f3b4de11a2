"""One patch onto the rebase tree's HEAD, classified as the rebase report shows it (see ``tools.rebase``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

from tools.apply import SeriesPatch, classify
from tools.gitutil import Git
from tools.hunkcheck import HunkStatus
from tools.versions import release_key


class RebaseStatus(Enum):
    EXACT = "exact"
    OFFSET = "offset (refreshed)"
    MERGED = "3-way merged (refreshed)"
    CONFLICT = "conflict"
    RESOLVED = "conflict resolved by hand"
    UPSTREAM = "already upstream"
    OBSOLETE = "obsolete"
    BLOCKED = "blocked"  # a patch it Requires did not port

    @property
    def ported(self) -> bool:
        return self in (RebaseStatus.EXACT, RebaseStatus.OFFSET, RebaseStatus.MERGED, RebaseStatus.RESOLVED)

    @property
    def provides(self) -> bool:
        """What the patch added is in the new tree (ported, or upstream has it)."""
        return self.ported or self is RebaseStatus.UPSTREAM

    @property
    def droppable(self) -> bool:
        return self in (RebaseStatus.UPSTREAM, RebaseStatus.OBSOLETE)


@dataclass(frozen=True)
class PatchOutcome:
    name: str
    status: RebaseStatus
    detail: str = ""


def _touched_existing(sp: SeriesPatch) -> list[str]:
    return [f.source for f in sp.patch.files if f.source is not None]


def declared_upstream(sp: SeriesPatch, new_ref: str) -> str:
    """The patch's own ``Upstream-Status: upstream since vX`` when vX <= new_ref, else ''."""
    m = re.match(r"upstream since (\S+)", sp.patch.upstream_status.strip())
    if not m:
        return ""
    since, new = release_key(m.group(1)), release_key(new_ref)
    return m.group(1) if since is not None and new is not None and since <= new else ""


_DEF_RE = re.compile(r"^\s*(?:async\s+def|def|class)\s+(\w+)")


def _defined(text: str | None) -> list[str]:
    return [m.group(1) for ln in (text or "").splitlines() if (m := _DEF_RE.match(ln))]


def upstream_ownrelease_key(repo: Git, sp: SeriesPatch, old_base: str | None) -> list[str]:
    """Names the patch adds (def/class, removing nothing) that upstream has since defined itself.

    Returns ``["path: a, b"]`` per file when *every* public definition the patch adds is now defined in
    upstream's file more often than in the old base's (so upstream wrote its own version, which
    a 3-way merge would duplicate or conflict with); [] otherwise.
    """
    out = []
    for f in sp.patch.files:
        if f.source is None or f.target is None or f.source != f.target:
            return []
        if any(ln.kind == "-" for h in f.hunks for ln in h.lines):
            return []
        # private helpers (``_name``) are the patch's own plumbing; the public names are what it provides
        added = [
            m.group(1)
            for h in f.hunks
            for ln in h.lines
            if ln.kind == "+" and (m := _DEF_RE.match(ln.text)) and not m.group(1).startswith("_")
        ]
        if not added:
            continue
        new = _defined(repo.show_text("HEAD", f.source))
        old = _defined(repo.show_text(old_base, f.source) if old_base else None)
        if not all(new.count(n) > old.count(n) for n in added):
            return []
        out.append(f"{f.source}: {', '.join(dict.fromkeys(added))}")
    return out


@dataclass(frozen=True)
class SeriesContext:
    """What port_one needs to know beyond the patch: the old base, upstream's moves, and which
    earlier patches of the series create files (and whether they ported)."""

    new_ref: str = ""
    old_base: str | None = None
    renames: dict[str, str] = field(default_factory=dict)  # old path -> new path, upstream's own moves
    created_by: dict[str, str] = field(default_factory=dict)  # path -> earlier patch that creates it
    added_files: tuple[str, ...] = ()  # files upstream added since the old base (successor hints)


def upstream_moves(repo: Git, old_base: str, new_base: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """Upstream's renames (git's rename detection, >= 50% similar) and the files it added."""
    res = repo.run("diff", "-M", "-l10000", "--name-status", "--diff-filter=RA", old_base, new_base, check=False)
    renames, added = {}, []
    for ln in res.stdout.splitlines():
        parts = ln.split("\t")
        if len(parts) == 3 and parts[0].startswith("R"):
            renames[parts[1]] = parts[2]
        elif len(parts) == 2 and parts[0] == "A":
            added.append(parts[1])
    return renames, tuple(added)


def _similar(path: str, added: tuple[str, ...], limit: int = 3) -> list[str]:
    """New upstream files whose name ends like ``path``'s (cuda_graph_runner.py -> decode_cuda_graph_runner.py)."""
    base = path.rsplit("/", 1)[-1]
    hits = [a for a in added if a.rsplit("/", 1)[-1] == base or a.endswith("_" + base)]
    prefix = path.rsplit("/", 1)[0]
    near = len(prefix.split("/")) - 1  # same package at least up to the parent's parent
    hits = [
        a for a in hits if len([1 for x, y in zip(a.split("/"), prefix.split("/"), strict=False) if x == y]) >= near
    ]

    def closeness(a: str) -> tuple[int, str]:
        common = len([1 for x, y in zip(a.split("/"), prefix.split("/"), strict=False) if x == y])
        return (-common, a)

    return sorted(hits, key=closeness)[:limit]


def _missing_notes(gone: list[str], ctx: SeriesContext) -> tuple[list[str], list[str]]:
    """(notes for the report, paths truly removed upstream) for files the patch changes that HEAD lacks."""
    removed = [p for p in gone if p not in ctx.renames and p not in ctx.created_by]
    notes = []
    plain = [p for p in removed if not _similar(p, ctx.added_files)]
    if plain:
        notes.append("obsolete in part: " + ", ".join(plain) + " removed upstream (no successor found)")
    for p in removed:
        if p not in plain:
            notes.append(
                f"{p} removed upstream; new files with a similar name: " + ", ".join(_similar(p, ctx.added_files))
            )
    moved = [f"{p} -> {ctx.renames[p]}" for p in gone if p in ctx.renames]
    if moved:
        notes.append("moved upstream: " + ", ".join(moved))
    needs = [p for p in gone if p in ctx.created_by and p not in ctx.renames]
    for dep in dict.fromkeys(ctx.created_by[p] for p in needs):
        files = ", ".join(p for p in needs if ctx.created_by[p] == dep)
        notes.append(f"needs {files} from {dep}, which did not port")
    return notes, removed


def port_one(repo: Git, sp: SeriesPatch, *, check: bool, ctx: SeriesContext | None = None) -> PatchOutcome:
    """Try one patch on the rebase tree's HEAD; on success HEAD has moved by one commit."""
    ctx = ctx or SeriesContext()
    name = sp.path.name
    touched = _touched_existing(sp)
    gone = [p for p in touched if repo.show_file("HEAD", p) is None]
    notes, removed = _missing_notes(gone, ctx)
    if touched and len(removed) == len(touched) and all(f.source for f in sp.patch.files):
        return PatchOutcome(name, RebaseStatus.OBSOLETE, "files removed upstream: " + ", ".join(removed))
    own = upstream_ownrelease_key(repo, sp, ctx.old_base)  # before the hunk check: applying would duplicate
    if own:
        since = declared_upstream(sp, ctx.new_ref) if ctx.new_ref else ""
        return PatchOutcome(name, RebaseStatus.UPSTREAM, _upstream_why(own, since))
    head = repo.head() or ""
    result = classify(repo, head, [sp.patch])[0]
    if result.status in (HunkStatus.EXACT, HunkStatus.OFFSET):
        res = repo.am([sp.path])
        if res.returncode == 0:
            if result.status is HunkStatus.EXACT:
                return PatchOutcome(name, RebaseStatus.EXACT)
            offs = ", ".join(sorted({h.label for h in result.hunks if h.status is HunkStatus.OFFSET}))
            return PatchOutcome(name, RebaseStatus.OFFSET, offs)
        repo.run("am", "--abort", check=False)
    if repo.run("apply", "--check", "-R", str(sp.path), check=False).returncode == 0:
        return PatchOutcome(name, RebaseStatus.UPSTREAM, "the patch reverse-applies: upstream has the change")
    since = declared_upstream(sp, ctx.new_ref) if ctx.new_ref else ""
    if since:  # it does not apply as is, and its author says upstream has it: trust, and say why
        return PatchOutcome(name, RebaseStatus.UPSTREAM, _upstream_why([], since))
    res = repo.am([sp.path], three_way=True)
    if res.returncode == 0:
        if repo.head() == head:
            return PatchOutcome(name, RebaseStatus.UPSTREAM, "empty after the 3-way merge")
        return PatchOutcome(name, RebaseStatus.MERGED, "; ".join([_hunk_notes(result), *notes]))
    conflicted = [p for p in repo.out("diff", "--name-only", "--diff-filter=U").split() if p not in removed]
    detail = ("conflicts in " + ", ".join(conflicted)) if conflicted else (res.stderr.strip().splitlines() or [""])[-1]
    detail = "; ".join([detail, *notes])
    if check:
        repo.run("am", "--abort", check=False)
    return PatchOutcome(name, RebaseStatus.CONFLICT, detail)


def _upstream_why(own: list[str], since: str) -> str:
    why = []
    if own:
        why.append(
            "upstream defines what the patch adds (its own version; applying would duplicate it): " + "; ".join(own)
        )
    if since:
        why.append(f"the header declares Upstream-Status: upstream since {since}")
    return "; ".join(why)


def _hunk_notes(result: object) -> str:
    hunks = getattr(result, "hunks", ())
    bad = [h for h in hunks if h.status is not HunkStatus.EXACT]
    return f"{len(bad)} of {len(hunks)} hunks did not match exactly"


def unmet_requirements(sp: SeriesPatch, outcomes: list[PatchOutcome]) -> list[str]:
    """The patch's Requires that did not port, with what happened to them."""
    status = {o.name: o.status for o in outcomes}
    return [
        f"{need} ({status[need].value if need in status else 'not in the series'})"
        for need in sp.patch.requires
        if need not in status or not status[need].provides
    ]


def superseded_note(sp: SeriesPatch, new_ref: str) -> str:
    sup = sp.patch.superseded_by
    since, new = (release_key(sup.since), release_key(new_ref)) if sup else (None, None)
    if sup is None or since is None or new is None or since > new:
        return ""
    return f"upstream serves this patch's purpose since {sup.since}: {sup.what}; review whether to drop it"
