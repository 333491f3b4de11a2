"""``rebase``: port the series to another upstream ref, patch by patch, with a report.

Each patch is classified on the new base, in this order (anchors §2: detect upstreamed patches,
never fuzz, 3-way on rebase, range-diff of series versions):

* obsolete - every file it changes is gone upstream;
* exact / offset - our hunk check passes (offset patches are refreshed by the export);
* upstream - it reverse-applies, or ``git am -3`` merges it to nothing;
* merged - ``git am -3`` ported it (refreshed);
* conflict - ``git am -3`` stopped: resolve in the rebase tree, or ``--abort``.

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
from dataclasses import asdict, dataclass
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

    @property
    def ported(self) -> bool:
        return self in (RebaseStatus.EXACT, RebaseStatus.OFFSET, RebaseStatus.MERGED, RebaseStatus.RESOLVED)

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


def port_one(repo: Git, sp: SeriesPatch, *, check: bool) -> PatchOutcome:
    """Try one patch on the rebase tree's HEAD; on success HEAD has moved by one commit."""
    name = sp.path.name
    touched = _touched_existing(sp)
    gone = [p for p in touched if repo.show_file("HEAD", p) is None]
    if touched and len(gone) == len(touched) and all(f.source for f in sp.patch.files):
        return PatchOutcome(name, RebaseStatus.OBSOLETE, "files gone upstream: " + ", ".join(gone))
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
    res = repo.am([sp.path], three_way=True)
    if res.returncode == 0:
        if repo.head() == head:
            return PatchOutcome(name, RebaseStatus.UPSTREAM, "empty after the 3-way merge")
        return PatchOutcome(name, RebaseStatus.MERGED, _hunk_notes(result))
    conflicted = repo.out("diff", "--name-only", "--diff-filter=U").split()
    detail = ("conflicts in " + ", ".join(conflicted)) if conflicted else (res.stderr.strip().splitlines() or [""])[-1]
    if gone:
        detail += "; files gone upstream: " + ", ".join(gone)
    if check:
        repo.run("am", "--abort", check=False)
    return PatchOutcome(name, RebaseStatus.CONFLICT, detail)


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
        if State.load(repo):
            raise ToolError(
                f"a rebase to {new_ref} is in progress in {path}: finish it with `make rebase SGLANG_REF={new_ref} "
                "CONTINUE=1` or give up with `ABORT=1`"
            )
        shutil.rmtree(path)
    repo = Git.init(path)
    old_base, _ = materialise(project, repo, old_ref)
    say(f"rebuilding the old series on {old_ref} (for the range-diff)")
    with tempfile.TemporaryDirectory(prefix=".rebase-", dir=project.build_dir) as scratch:
        old_head = build_commits(repo, old_base, patches, Path(scratch)) if patches else old_base
    new_base, _ = materialise(project, repo, new_ref)
    repo.run("checkout", "-q", "-f", "-B", "rebase", new_base)
    state = State(old_ref, new_ref, old_base, old_head, new_base, [sp.path.name for sp in patches], [])
    return repo, state


def _run_patches(repo: Git, state: State, patches: list[SeriesPatch], check: bool) -> State:
    by_name = {sp.path.name: sp for sp in patches}
    counter = Counter(len(state.names), "porting")
    counter.n = len(state.outcomes)
    outcomes = list(state.outcomes)
    for name in state.names[len(state.outcomes):]:
        counter.step(name)
        o = port_one(repo, by_name[name], check=check)
        say(f"    {o.status.value}" + (f": {o.detail}" if o.detail else ""))
        outcomes.append({"name": o.name, "status": o.status.value, "detail": o.detail})
        state = State(**{**asdict(state), "outcomes": outcomes})
        if o.status is RebaseStatus.CONFLICT and not check:
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
        raise ToolError(
            "not updating the series: " + ", ".join(f"{o.name} ({o.status.value})" for o in droppable)
            + " would leave it. Read the report; if they really are no longer needed, rerun with DROP=1 "
            "(--drop) to remove them from series and patches/."
        )
    commits = repo.commits(state.new_base, repo.head() or state.new_base)
    ported = [o for o in outcomes if o.status.ported]
    if len(commits) != len(ported):
        raise ToolError(f"internal: {len(commits)} commits for {len(ported)} ported patches; not writing anything")
    for o, c in zip(ported, commits):
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
                raise ToolError(f"git am --continue failed in {path}:\n{(res.stderr or res.stdout).strip()}")
        outs = list(state.outcomes)
        outs[-1] = {**outs[-1], "status": RebaseStatus.RESOLVED.value}
        state = State(**{**asdict(state), "outcomes": outs})
    else:
        repo, state = _start(project, new_ref, patches)
    state = _run_patches(repo, state, patches, args.check)
    outcomes = _outcomes(state)
    stopped = outcomes and outcomes[-1].status is RebaseStatus.CONFLICT and not args.check
    note = "Report only (--check): nothing in the project was changed." if args.check else ""
    if stopped:
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
    if stopped:
        raise ToolError(note)
    if args.check:
        conflicts = [o.name for o in outcomes if o.status is RebaseStatus.CONFLICT]
        return 1 if conflicts else 0
    print(_finish(project, repo, state, outcomes, args.drop))
    return 0
