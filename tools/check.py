"""``check``: everything that must hold for the series to be mergeable, all reported in one run."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from tools.apply import build_commits, classify, hunk_problems, read_series_patches, resolve_ref
from tools.errors import ToolError
from tools.export import reexport_diff
from tools.formatcheck import format_problems, missing_formatters
from tools.gitutil import Git
from tools.project import Project
from tools.upstream import materialise

logger = logging.getLogger(__name__)


def scratch_repo(project: Project) -> Git:
    """A cache repository holding base commits, so check/status need no tree."""
    path = project.cache_dir / "repo"
    if (path / ".git").exists():
        return Git(path)
    return Git.init(path)


def run_check(project: Project, ref: str | None = None) -> list[str]:
    ref = resolve_ref(project, ref)
    loaded = read_series_patches(project, strict_unused=True, headers=True)
    problems = list(loaded.problems)
    if loaded.unchecked_note():
        problems.append(loaded.unchecked_note() or "")
    repo = scratch_repo(project)
    try:
        base, _ = materialise(project, repo, ref)
    except ToolError as err:
        return problems + [f"cannot materialise {ref}: {err}"]
    results = classify(repo, base, [sp.patch for sp in loaded.patches])
    hunks = hunk_problems(results, allow_offset=False)
    if hunks:
        problems.extend(hunks)
        problems.append("re-export not checked: the series does not apply exactly")
        return problems
    logger.info(f"re-exporting {len(loaded.patches)} patch(es) to check they are refreshed")
    with tempfile.TemporaryDirectory(prefix=".check-", dir=project.cache_dir) as scratch:
        head = build_commits(repo, base, list(loaded.patches), Path(scratch))
        commits = repo.commits(base, head)
        for name in reexport_diff(repo, commits, [sp.path for sp in loaded.patches]):
            problems.append(
                f"{name}: re-export would change the file (not in canonical format-patch form); "
                "run `make apply && make refresh` and commit the result"
            )
        problems.extend(_format_problems(repo, base, head))
    return problems


def _format_problems(repo: Git, base: str, head: str) -> list[str]:
    missing = missing_formatters()
    if missing:
        return ["formatting not checked: SGLang's formatters are missing: " + "; ".join(missing)]
    logger.info("running SGLang's formatters (black, isort) on the files the series changes")
    return [p.describe() for p in format_problems(repo, base, head)]
