"""``rebase``: port the series to another upstream ref, patch by patch, with a report.

Each patch is classified on the new base, in this order (anchors §2: detect upstreamed patches,
never fuzz, 3-way on rebase, range-diff of series versions):

* obsolete - every file it changes was removed upstream (not moved: git's rename detection);
* upstream (own version) - every public def/class it adds (removing nothing) upstream now defines
  itself, so applying or merging it would duplicate them;
* exact / offset - our hunk check passes (offset patches are refreshed by the export);
* upstream - it reverse-applies, or its header declares ``upstream since vX`` with vX <= the new
  ref, or ``git am -3`` merges it to nothing;
* merged - ``git am -3`` ported it (refreshed);
* blocked - a patch it ``Requires:`` did not port (checked before anything else);
* conflict - ``git am -3`` stopped: resolve in the rebase tree, or ``--abort``. The detail names
  the conflicted files and, separately, files removed upstream (that part is obsolete), files
  upstream moved (git's rename detection, or new files with a similar name) and files an earlier
  patch of the series would have created but did not port.

Nothing is dropped silently: upstream/obsolete patches stay in the series unless ``--drop``.
``--check`` writes the report and changes nothing. On success the patches, ``series`` and
``sglang.lock`` are updated together, so the roll is one reviewable change in the project.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path

from tools.apply import SeriesPatch, build_commits, classify, load_patches
from tools.errors import ToolError
from tools.export import canonical
from tools.gitutil import Git
from tools.hunkcheck import HunkStatus
from tools.progress import Counter, say
from tools.project import Project
from tools.upstream import known_entry, materialise, pinned_ref, write_lock

STATE_FILE = "sglang-rebase.json"


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


def _worktree_text(repo: Git, path: str) -> str | None:
    data = repo.show_file("HEAD", path)
    return data.decode("utf-8", "surrogateescape") if data is not None else None


def _version(ref: str) -> tuple[int, ...] | None:
    m = re.fullmatch(r"v?(\d+(?:\.\d+)*)(?:\.post\d+)?", ref.strip())
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def declared_upstream(sp: SeriesPatch, new_ref: str) -> str:
    """The patch's own ``Upstream-Status: upstream since vX`` when vX <= new_ref, else ''."""
    m = re.match(r"upstream since (\S+)", sp.patch.upstream_status.strip())
    if not m:
        return ""
    since, new = _version(m.group(1)), _version(new_ref)
    return m.group(1) if since is not None and new is not None and since <= new else ""


_DEF_RE = re.compile(r"^\s*(?:async\s+def|def|class)\s+(\w+)")


def _defined(text: str | None) -> list[str]:
    return [m.group(1) for ln in (text or "").splitlines() if (m := _DEF_RE.match(ln))]


def upstream_own_version(repo: Git, sp: SeriesPatch, old_base: str | None) -> list[str]:
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
        added = [m.group(1) for h in f.hunks for ln in h.lines
                 if ln.kind == "+" and (m := _DEF_RE.match(ln.text)) and not m.group(1).startswith("_")]
        if not added:
            continue
        new = _defined(_worktree_text(repo, f.source))
        old_data = repo.show_file(old_base, f.source) if old_base else None
        old = _defined(old_data.decode("utf-8", "surrogateescape") if old_data is not None else None)
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
    hits = [a for a in hits if len([1 for x, y in zip(a.split("/"), prefix.split("/"), strict=False) if x == y]) >= near]

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
            notes.append(f"{p} removed upstream; new files with a similar name: " + ", ".join(_similar(p, ctx.added_files)))
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
    own = upstream_own_version(repo, sp, ctx.old_base)  # before the hunk check: applying would duplicate
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
        why.append("upstream defines what the patch adds (its own version; applying would duplicate it): "
                   + "; ".join(own))
    if since:
        why.append(f"the header declares Upstream-Status: upstream since {since}")
    return "; ".join(why)


def _hunk_notes(result: object) -> str:
    hunks = getattr(result, "hunks", ())
    bad = [h for h in hunks if h.status is not HunkStatus.EXACT]
    return f"{len(bad)} of {len(hunks)} hunks did not match exactly"


# -- state across a conflict ----------------------------------------------------------------
@dataclass(frozen=True)
class State:
    old_ref: str
    new_ref: str
    old_base: str
    old_head: str
    new_base: str
    names: list[str]
    outcomes: list[dict[str, str]]
    conflict_head: str = ""  # HEAD when the rebase stopped at a conflict

    @property
    def complete(self) -> bool:
        return len(self.outcomes) == len(self.names) and not (
            self.outcomes and self.outcomes[-1]["status"] == RebaseStatus.CONFLICT.value
        )

    def save(self, repo: Git) -> None:
        (repo.path / ".git" / STATE_FILE).write_text(json.dumps(asdict(self), indent=1))

    @staticmethod
    def load(repo: Git) -> "State | None":
        p = repo.path / ".git" / STATE_FILE
        return State(**json.loads(p.read_text())) if p.exists() else None


def _outcomes(state: State) -> list[PatchOutcome]:
    return [PatchOutcome(o["name"], RebaseStatus(o["status"]), o.get("detail", "")) for o in state.outcomes]


# -- report ---------------------------------------------------------------------------------
def report_markdown(state: State, outcomes: list[PatchOutcome], range_diff: str, note: str) -> str:
    lines = [f"# Rebase report: {state.old_ref} -> {state.new_ref}", ""]
    if note:
        lines += [note, ""]
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status.value] = counts.get(o.status.value, 0) + 1
    lines += ["Summary: " + (", ".join(f"{n} {k}" for k, n in counts.items()) or "empty series"), ""]
    lines += ["| # | patch | status | detail |", "|---|---|---|---|"]
    for i, o in enumerate(outcomes, 1):
        lines.append(f"| {i} | {o.name} | {o.status.value} | {o.detail.replace('|', '/')} |")
    pending = state.names[len(outcomes):]
    for j, n in enumerate(pending, len(outcomes) + 1):
        lines.append(f"| {j} | {n} | not reached | |")
    lines += ["", "## Range-diff (old series vs ported series)", "", "```", range_diff.rstrip() or "(no commits)", "```", ""]
    return "\n".join(lines)


def _range_diff(repo: Git, state: State) -> str:
    new_head = repo.head() or state.new_base
    if new_head == state.new_base or state.old_head == state.old_base:
        # range-diff refuses an empty range; say plainly what was not carried over
        old = repo.out("log", "--reverse", "--format=%h %s", f"{state.old_base}..{state.old_head}")
        return "no ported commits; the old series was:\n" + (old or "(empty)")
    res = repo.run(
        "range-diff", "--no-color", f"{state.old_base}..{state.old_head}", f"{state.new_base}..{new_head}", check=False
    )
    return res.stdout if res.returncode == 0 else f"(range-diff failed: {res.stderr.strip()})"


# -- main flow ------------------------------------------------------------------------------
def _rebase_dir(project: Project, new_ref: str) -> Path:
    return project.build_dir / f"rebase-{new_ref}"


def _start(project: Project, new_ref: str, patches: list[SeriesPatch]) -> tuple[Git, State]:
    old_ref = pinned_ref(project)
    if not old_ref:
        raise ToolError("sglang.lock pins no ref; `make apply SGLANG_REF=...` first")
    path = _rebase_dir(project, new_ref)
    if path.exists():
        repo = Git(path)
        st = State.load(repo)
        if st and not st.complete:
            raise ToolError(
                f"a rebase to {new_ref} is in progress in {path}: finish it with `make rebase SGLANG_REF={new_ref} "
                "CONTINUE=1` or give up with `ABORT=1`"
            )
        shutil.rmtree(path)
    repo = Git.init(path)
    old_base, _ = materialise(project, repo, old_ref)
    # Where the series was made, every index line must hold: a damaged file is refused before it ports.
    damage = [h.describe() for r in classify(repo, old_base, [sp.patch for sp in patches])
              for h in r.hunks if h.status is HunkStatus.DAMAGED]
    if damage:
        shutil.rmtree(path)
        raise ToolError("\n".join(damage) + f"\nnot rebasing a damaged series; `make check` at {old_ref} shows it too")
    say(f"rebuilding the old series on {old_ref} (for the range-diff)")
    with tempfile.TemporaryDirectory(prefix=".rebase-", dir=project.build_dir) as scratch:
        old_head = build_commits(repo, old_base, patches, Path(scratch)) if patches else old_base
    new_base, _ = materialise(project, repo, new_ref)
    repo.run("checkout", "-q", "-f", "-B", "rebase", new_base)
    state = State(old_ref, new_ref, old_base, old_head, new_base, [sp.path.name for sp in patches], [])
    return repo, state


def _created_by(state: State, by_name: dict[str, SeriesPatch], outcomes: list[dict[str, str]]) -> dict[str, str]:
    """Files created by earlier patches of the series that did not port: path -> patch name."""
    out: dict[str, str] = {}
    for o in outcomes:
        if RebaseStatus(o["status"]).ported:
            continue
        for f in by_name[o["name"]].patch.files:
            if f.source is None and f.target is not None:
                out.setdefault(f.target, o["name"])
    return out


def unmet_requirements(sp: SeriesPatch, outcomes: list[dict[str, str]]) -> list[str]:
    """The patch's Requires that did not port, with what happened to them."""
    status = {o["name"]: RebaseStatus(o["status"]) for o in outcomes}
    return [f"{need} ({status[need].value if need in status else 'not in the series'})"
            for need in sp.patch.requires if need not in status or not status[need].provides]


def superseded_note(sp: SeriesPatch, new_ref: str) -> str:
    sup = sp.patch.superseded_by
    since, new = (_version(sup.since), _version(new_ref)) if sup else (None, None)
    if sup is None or since is None or new is None or since > new:
        return ""
    return f"upstream serves this patch's purpose since {sup.since}: {sup.what}; review whether to drop it"


def _port_or_block(repo: Git, sp: SeriesPatch, outcomes: list[dict[str, str]], check: bool,
                   ctx: SeriesContext) -> PatchOutcome:
    unmet = unmet_requirements(sp, outcomes)
    if unmet:
        o = PatchOutcome(sp.path.name, RebaseStatus.BLOCKED, "requires " + ", ".join(unmet) + ", which did not port")
    else:
        o = port_one(repo, sp, check=check, ctx=ctx)
    note = superseded_note(sp, ctx.new_ref)
    return PatchOutcome(o.name, o.status, "; ".join(x for x in (o.detail, note) if x)) if note else o


def _run_patches(repo: Git, state: State, patches: list[SeriesPatch], check: bool) -> State:
    by_name = {sp.path.name: sp for sp in patches}
    counter = Counter(len(state.names), "porting")
    counter.n = len(state.outcomes)
    outcomes = list(state.outcomes)
    renames, added = upstream_moves(repo, state.old_base, state.new_base)
    for name in state.names[len(state.outcomes):]:
        counter.step(name)
        ctx = SeriesContext(state.new_ref, state.old_base, renames, _created_by(state, by_name, outcomes), added)
        o = _port_or_block(repo, by_name[name], outcomes, check, ctx)
        say(f"    {o.status.value}" + (f": {o.detail}" if o.detail else ""))
        outcomes.append({"name": o.name, "status": o.status.value, "detail": o.detail})
        state = State(**{**asdict(state), "outcomes": outcomes})
        if o.status in (RebaseStatus.CONFLICT, RebaseStatus.BLOCKED) and not check:
            break
    return state


def _update_applies_to(text: str, new_ref: str) -> str:
    head, sep, rest = text.partition("\n---\n")

    def add(m: re.Match[str]) -> str:
        refs = [r for r in re.split(r"[,\s]+", m.group(1).strip()) if r]
        return "Applies-To: " + ", ".join(refs + ([new_ref] if new_ref not in refs else []))

    return re.sub(r"^Applies-To:(.*)$", add, head, count=1, flags=re.M) + sep + rest


def _finish(project: Project, repo: Git, state: State, outcomes: list[PatchOutcome], drop: bool) -> str:
    droppable = [o for o in outcomes if o.status.droppable]
    if droppable and not drop:
        state.save(repo)  # complete: CONTINUE=1 DROP=1 finishes without redoing resolved conflicts
        raise ToolError(
            "not updating the series: " + ", ".join(f"{o.name} ({o.status.value})" for o in droppable)
            + " would leave it. Read the report; if they really are no longer needed, rerun with DROP=1 "
            "(--drop) to remove them from series and patches/ (after resolving conflicts by hand: "
            f"`make rebase SGLANG_REF={state.new_ref} CONTINUE=1 DROP=1` keeps your resolutions)."
        )
    commits = repo.commits(state.new_base, repo.head() or state.new_base)
    ported = [o for o in outcomes if o.status.ported]
    if len(commits) != len(ported):
        raise ToolError(f"internal: {len(commits)} commits for {len(ported)} ported patches; not writing anything")
    for o, c in zip(ported, commits, strict=False):
        text = _update_applies_to(canonical(repo.format_patch(c)), state.new_ref)
        (project.patches_dir / o.name).write_bytes(text.encode("utf-8", "surrogateescape"))
    dropped = {o.name for o in droppable}
    if dropped:
        lines = project.series_path.read_text().splitlines(keepends=True)
        keep = [ln for ln in lines if ln.split("#", 1)[0].strip() not in dropped]
        project.series_path.write_text("".join(keep))
        for n in dropped:
            (project.patches_dir / n).unlink(missing_ok=True)
    entry = known_entry(project, state.new_ref)
    if entry is None:
        raise ToolError(f"no lock entry recorded for {state.new_ref}")
    write_lock(project.lock_path, entry)
    (repo.path / ".git" / STATE_FILE).unlink(missing_ok=True)
    return (
        f"series rolled to {state.new_ref}: {len(ported)} patch(es) written, {len(dropped)} dropped; sglang.lock pins "
        f"{state.new_ref}. Next: `make apply && make check && make test`, then commit patches/, series and "
        "sglang.lock together."
    )


def run_rebase(project: Project, args: argparse.Namespace) -> int:
    new_ref = args.to
    report_path = Path(args.report) if args.report else project.build_dir / f"rebase-{new_ref}.md"
    path = _rebase_dir(project, new_ref)
    if args.abort:
        if path.exists():
            Git(path).run("am", "--abort", check=False)
            shutil.rmtree(path)
        print(f"rebase to {new_ref} abandoned; nothing in the project was changed")
        return 0
    patches = load_patches(project, strict_unused=False)
    if args.cont:
        repo = Git(path)
        state = State.load(repo) if path.exists() else None
        if state is None:
            raise ToolError(f"no rebase to {new_ref} in progress")
        if (path / ".git" / "rebase-apply").exists():
            res = repo.run("am", "--continue", check=False, fixed_ident=True)
            if res.returncode != 0:
                raise ToolError(
                    f"git am --continue failed in {path}:\n{(res.stderr or res.stdout).strip()}\n"
                    "(if upstream already has the change, `git am --skip` there, then CONTINUE=1 again)"
                )
        outs = list(state.outcomes)
        if outs and outs[-1]["status"] == RebaseStatus.CONFLICT.value:
            if state.conflict_head and repo.head() == state.conflict_head:  # `git am --skip`
                outs[-1] = {**outs[-1], "status": RebaseStatus.UPSTREAM.value,
                            "detail": "resolved to nothing by hand (git am --skip): " + outs[-1].get("detail", "")}
            else:
                outs[-1] = {**outs[-1], "status": RebaseStatus.RESOLVED.value}
        state = State(**{**asdict(state), "outcomes": outs})
    else:
        repo, state = _start(project, new_ref, patches)
    state = _run_patches(repo, state, patches, args.check)
    outcomes = _outcomes(state)
    stopped = outcomes and outcomes[-1].status is RebaseStatus.CONFLICT and not args.check
    blocked = outcomes and outcomes[-1].status is RebaseStatus.BLOCKED and not args.check
    note = "Report only (--check): nothing in the project was changed." if args.check else ""
    if blocked:
        note = (
            f"Stopped at {outcomes[-1].name}: it {outcomes[-1].detail}. Port or rework what it needs first, or "
            f"drop it from series; `make rebase SGLANG_REF={new_ref} ABORT=1` cleans up. Nothing in the project "
            "was changed."
        )
    elif stopped:
        state = State(**{**asdict(state), "conflict_head": repo.head() or ""})
        state.save(repo)
        note = (
            f"Stopped at {outcomes[-1].name}: resolve the conflicts in {path} (edit, `git add`), then "
            f"`make rebase SGLANG_REF={new_ref} CONTINUE=1`; or `make rebase SGLANG_REF={new_ref} ABORT=1` to give up. "
            "Nothing in the project was changed."
        )
    report = report_markdown(state, outcomes, _range_diff(repo, state), note)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(report)
    print(report)
    say(f"report written to {report_path}")
    if stopped or blocked:
        raise ToolError(note)
    if args.check:
        conflicts = [o.name for o in outcomes if o.status in (RebaseStatus.CONFLICT, RebaseStatus.BLOCKED)]
        return 1 if conflicts else 0
    print(_finish(project, repo, state, outcomes, args.drop))
    return 0
