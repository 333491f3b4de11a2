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

import logging
import re
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from tools.apply import SeriesPatch, build_commits, classify, load_patches
from tools.errors import ToolError
from tools.export import canonical
from tools.gitutil import Git
from tools.hunkcheck import HunkStatus
from tools.lockfile import known_entry, pinned_ref, write_lock
from tools.progress import Counter
from tools.project import Project
from tools.rebase_port import (
    PatchOutcome,
    RebaseStatus,
    SeriesContext,
    port_one,
    superseded_note,
    unmet_requirements,
    upstream_moves,
)
from tools.rebase_state import STATE_FILE, State, _range_diff, report_markdown
from tools.upstream import materialise

logger = logging.getLogger(__name__)


# -- main flow ------------------------------------------------------------------------------
def rebase_tree(project: Project, new_ref: str) -> Path:
    """Where the port is built; each line's ports apart, as two lines may be ported to one release."""
    if project.line is None:
        return project.build_dir / f"rebase-{new_ref}"
    return project.build_dir / f"rebase-{project.line}-to-{new_ref}"


def report_path_for(project: Project, new_ref: str, check: bool) -> Path:
    """A report-only run is what docs/rebase/ keeps for each release (a line's under its name); a real
    one stays with its build."""
    if not check:
        return rebase_tree(project, new_ref).with_name(rebase_tree(project, new_ref).name + ".md")
    docs = project.root / "docs" / "rebase"
    return (docs if project.line is None else docs / project.line) / f"{new_ref}.md"


def _start(project: Project, new_ref: str, patches: list[SeriesPatch]) -> tuple[Git, State]:
    old_ref = pinned_ref(project)
    if not old_ref:
        raise ToolError("sglang.lock pins no ref; `make apply SGLANG_REF=...` first")
    path = rebase_tree(project, new_ref)
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
    damage = [
        h.describe()
        for r in classify(repo, old_base, [sp.patch for sp in patches])
        for h in r.hunks
        if h.status is HunkStatus.DAMAGED
    ]
    if damage:
        shutil.rmtree(path)
        raise ToolError("\n".join(damage) + f"\nnot rebasing a damaged series; `make check` at {old_ref} shows it too")
    logger.info(f"rebuilding the old series on {old_ref} (for the range-diff)")
    with tempfile.TemporaryDirectory(prefix=".rebase-", dir=project.build_dir) as scratch:
        old_head = build_commits(repo, old_base, patches, Path(scratch)) if patches else old_base
    new_base, _ = materialise(project, repo, new_ref)
    repo.run("checkout", "-q", "-f", "-B", "rebase", new_base)
    state = State(old_ref, new_ref, old_base, old_head, new_base, tuple(sp.path.name for sp in patches))
    return repo, state


def _created_by(by_name: dict[str, SeriesPatch], outcomes: list[PatchOutcome]) -> dict[str, str]:
    """Files created by earlier patches of the series that did not port: path -> patch name."""
    out: dict[str, str] = {}
    for o in outcomes:
        if o.status.ported:
            continue
        for f in by_name[o.name].patch.files:
            if f.source is None and f.target is not None:
                out.setdefault(f.target, o.name)
    return out


def _port_or_block(
    repo: Git, sp: SeriesPatch, outcomes: list[PatchOutcome], check: bool, ctx: SeriesContext
) -> PatchOutcome:
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
    for name in state.names[len(state.outcomes) :]:
        counter.step(name)
        ctx = SeriesContext(state.new_ref, state.old_base, renames, _created_by(by_name, outcomes), added)
        o = _port_or_block(repo, by_name[name], outcomes, check, ctx)
        logger.info(f"    {o.status.value}" + (f": {o.detail}" if o.detail else ""))
        outcomes.append(o)
        state = state.with_outcomes(outcomes)
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
            "not updating the series: "
            + ", ".join(f"{o.name} ({o.status.value})" for o in droppable)
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


def run_rebase(
    project: Project,
    new_ref: str,
    *,
    check: bool = False,
    drop: bool = False,
    cont: bool = False,
    abort: bool = False,
    report: Path | None = None,
) -> int:
    """Port the series to ``new_ref`` (see the module docstring); the library entry point of ``rebase``."""
    report_path = report or report_path_for(project, new_ref, check)
    path = rebase_tree(project, new_ref)
    if abort:
        if path.exists():
            Git(path).run("am", "--abort", check=False)
            shutil.rmtree(path)
        print(f"rebase to {new_ref} abandoned; nothing in the project was changed")
        return 0
    patches = load_patches(project, strict_unused=False)
    repo, state = _resume(path, new_ref) if cont else _start(project, new_ref, patches)
    state = _run_patches(repo, state, patches, check)
    outcomes = list(state.outcomes)
    stopped = outcomes and outcomes[-1].status is RebaseStatus.CONFLICT and not check
    blocked = outcomes and outcomes[-1].status is RebaseStatus.BLOCKED and not check
    note = "Report only (--check): nothing in the project was changed." if check else ""
    if blocked:
        note = (
            f"Stopped at {outcomes[-1].name}: it {outcomes[-1].detail}. Port or rework what it needs first, or "
            f"drop it from series; `make rebase SGLANG_REF={new_ref} ABORT=1` cleans up. Nothing in the project "
            "was changed."
        )
    elif stopped:
        state = replace(state, conflict_head=repo.head() or "")
        state.save(repo)
        note = (
            f"Stopped at {outcomes[-1].name}: resolve the conflicts in {path} (edit, `git add`), then "
            f"`make rebase SGLANG_REF={new_ref} CONTINUE=1`; or `make rebase SGLANG_REF={new_ref} ABORT=1` to give up. "
            "Nothing in the project was changed."
        )
    markdown = report_markdown(state, outcomes, _range_diff(repo, state), note)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(markdown)
    print(markdown)
    logger.info(f"report written to {report_path}")
    if stopped or blocked:
        raise ToolError(note)
    if check:
        conflicts = [o.name for o in outcomes if o.status in (RebaseStatus.CONFLICT, RebaseStatus.BLOCKED)]
        if conflicts:
            raise ToolError(
                f"{len(conflicts)} patch(es) do not port to {new_ref} as they are: "
                f"{', '.join(conflicts)}; the report is {report_path}"
            )
        return 0
    print(_finish(project, repo, state, outcomes, drop))
    return 0


def _resume(path: Path, new_ref: str) -> tuple[Git, State]:
    """The stopped rebase after the user resolved (or skipped) its conflict: the conflicted patch's
    outcome records which of the two it was."""
    repo = Git(path)
    state = State.load(repo) if path.exists() else None
    if state is None:
        raise ToolError(f"no rebase to {new_ref} in progress")
    if repo.operation_in_progress():
        res = repo.run("am", "--continue", check=False, fixed_ident=True)
        if res.returncode != 0:
            raise ToolError(
                f"git am --continue failed in {path}:\n{(res.stderr or res.stdout).strip()}\n"
                "(if upstream already has the change, `git am --skip` there, then CONTINUE=1 again)"
            )
    outs = list(state.outcomes)
    if outs and outs[-1].status is RebaseStatus.CONFLICT:
        last = outs[-1]
        if state.conflict_head and repo.head() == state.conflict_head:  # `git am --skip`
            outs[-1] = PatchOutcome(
                last.name, RebaseStatus.UPSTREAM, "resolved to nothing by hand (git am --skip): " + last.detail
            )
        else:
            outs[-1] = PatchOutcome(last.name, RebaseStatus.RESOLVED, last.detail)
    return repo, state.with_outcomes(outs)
