"""``status``: a table per patch: hunk classification per upstream version, Upstream-Status, Tests."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tools.apply import classify, load_patches, resolve_ref
from tools.check import scratch_repo
from tools.errors import ToolError
from tools.hunkcheck import HunkStatus, PatchResult
from tools.project import Project
from tools.upstream import materialise

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StatusRow:
    patch: str
    cells: tuple[str, ...]  # one per ref
    applies_to: str
    upstream_status: str
    tests: str


def _cell(r: PatchResult) -> str:
    if r.status is HunkStatus.EXACT:
        return HunkStatus.EXACT.value
    labels = sorted({h.label for h in r.hunks if h.status is not HunkStatus.EXACT})
    n_bad = sum(1 for h in r.hunks if h.status is not HunkStatus.EXACT)
    return f"{'; '.join(labels)} ({n_bad}/{len(r.hunks)} hunks)"


def status_rows(project: Project, refs: list[str]) -> tuple[list[str], list[StatusRow]]:
    patches = load_patches(project)
    repo = scratch_repo(project)
    columns: list[list[str]] = []
    for ref in refs:
        try:
            base, _ = materialise(project, repo, ref)
        except ToolError as e:
            # The reason is several lines (each source tried): once in the log, not in every row.
            logger.error(f"status: {ref} unavailable: {e}")
            columns.append([f"unavailable ({ref}: see the log above)"] * len(patches))
            continue
        columns.append([_cell(r) for r in classify(repo, base, [sp.patch for sp in patches])])
    rows = []
    for i, sp in enumerate(patches):
        rows.append(
            StatusRow(
                sp.path.name,
                tuple(col[i] for col in columns),
                ", ".join(sp.patch.applies_to) or "-",
                sp.patch.upstream_status or "-",
                " ".join(sp.patch.tests) or "-",
            )
        )
    return refs, rows


def render(refs: list[str], rows: list[StatusRow], pinned: str) -> str:
    head = (
        ["patch"] + [f"{r} (pinned)" if r == pinned else r for r in refs] + ["Applies-To", "Upstream-Status", "Tests"]
    )
    body = [[r.patch, *r.cells, r.applies_to, r.upstream_status, r.tests] for r in rows]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in body]
    if not rows:
        out.append("(series is empty)")
    return "\n".join(out)


def run_status(project: Project, ref: str | None, extra_refs: list[str]) -> str:
    pinned = resolve_ref(project, None) if project.lock_path.exists() else (ref or "")
    first = resolve_ref(project, ref)
    refs = [first] + [r for r in extra_refs if r != first]
    refs, rows = status_rows(project, refs)
    return render(refs, rows, pinned)
