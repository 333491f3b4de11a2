"""``check``: everything that must hold for the series to be mergeable, all reported in one run."""
from __future__ import annotations

import tempfile
from pathlib import Path

from tools.apply import build_commits, classify, failure_report, resolve_ref
from tools.errors import PatchParseError, ToolError
from tools.export import reexport_diff
from tools.gitutil import Git
from tools.patchfile import read_patch
from tools.progress import say
from tools.project import Project
from tools.series import read_series, series_problems
from tools.upstream import materialise


def scratch_repo(project: Project) -> Git:
    """A cache repository holding base commits, so check/status need no tree."""
    path = project.cache_dir / "repo"
    if (path / ".git").exists():
        return Git(path)
    return Git.init(path)


def run_check(project: Project, ref: str | None = None) -> list[str]:
    ref = resolve_ref(project, ref)
    series = read_series(project.series_path)
    problems = series_problems(series, project.patches_dir)
    patches = []
    for e in series.entries:
        path = project.patches_dir / e.name
        if not path.is_file():
            continue
        try:
            p = read_patch(path, e.name)
        except PatchParseError as err:
            problems.append(str(err))
            continue
        problems.extend(p.header_problems())
        patches.append((path, p))
    repo = scratch_repo(project)
    try:
        base, _ = materialise(project, repo, ref)
    except ToolError as err:
        return problems + [f"cannot materialise {ref}: {err}"]
    results = classify(repo, base, [p for _, p in patches])
    report = failure_report(results, ref, allow_offset=False)
    if report:
        problems.extend(report.splitlines()[:-1])
        problems.append("re-export not checked: the series does not apply exactly")
        return problems
    say(f"re-exporting {len(patches)} patch(es) to check they are refreshed")
    with tempfile.TemporaryDirectory(prefix=".check-", dir=project.cache_dir) as scratch:
        from tools.apply import SeriesPatch

        head = build_commits(repo, base, [SeriesPatch(path, p) for path, p in patches], Path(scratch))
        commits = repo.commits(base, head)
        for name in reexport_diff(repo, commits, [path for path, _ in patches]):
            problems.append(
                f"{name}: re-export would change the file (not in canonical format-patch form); "
                "run `make apply && make refresh` and commit the result"
            )
    return problems
