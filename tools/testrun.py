"""``test``: the tool's own tests, then each patch's declared tests against the tree with the series
applied up to and including that patch (a ``git worktree`` per patch), then tests/gpu on the full tree.

A failure names the patch that broke it. A declared node id that pytest cannot find is an error.
Declared GPU tests (under tests/gpu/) run once, in the full-tree run, unless ``gpu_per_patch``: each
starts servers, which with a large model takes minutes, and the per-patch run would repeat them.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tools.apply import APPLIED_REF, BASE_REF, load_patches
from tools.errors import TestFailure, ToolError
from tools.gitutil import Git
from tools.progress import Counter
from tools.project import Project

logger = logging.getLogger(__name__)

PYTEST_NO_TESTS = 5
PYTEST_USAGE = 4


@dataclass(frozen=True)
class TestOutcome:
    label: str
    ok: bool
    message: str


def line_python(project: Project) -> str:
    """The Python a line's patch tests run in: its own environment when it declares requirements."""
    if project.line_requirements is None:
        return sys.executable
    if not project.line_python.is_file():
        raise ToolError(
            f"{project.label} has its own requirements but {project.line_python} does not exist: "
            f"`make test SGLANG_REF={project.line}` sets it up (bash ci/bootstrap-venv.sh "
            f"{project.line_requirements.relative_to(project.root)} .venv-{project.line})"
        )
    return str(project.line_python)


def _pytest(project: Project, args: list[str], tree: Path | None) -> int:
    env = dict(os.environ)
    python = sys.executable
    if tree is not None:
        env["SGLANG_TREE"] = str(tree)
        python = line_python(project)
    cmd = [python, "-m", "pytest", *args]
    shown = "python" if python == sys.executable else python
    logger.info("$ " + ("SGLANG_TREE=" + str(tree) + " " if tree else "") + shown + " " + " ".join(cmd[1:]))
    return subprocess.run(cmd, cwd=project.root, env=env).returncode


def _describe(rc: int) -> str:
    if rc == PYTEST_NO_TESTS:
        return "pytest collected no tests: a declared node id matches nothing"
    if rc == PYTEST_USAGE:
        return "pytest could not find a declared node id (file or test does not exist)"
    return f"pytest exit {rc}"


def own_tests(project: Project, extra: list[str]) -> TestOutcome:
    args = ["tests", "--ignore=tests/patches", "--ignore=tests/gpu", "-q", *extra]
    rc = _pytest(project, args, None)
    return TestOutcome("tool tests", rc == 0, "" if rc == 0 else _describe(rc))


def patch_worktree(repo: Git, root: Path, name: str, commit: str) -> Path:
    path = root / name
    if path.exists() and Git(path).head() is not None:
        wt = Git(path)
        wt.run("checkout", "-q", "-f", "--detach", commit)
        wt.run("clean", "-q", "-fd")
    else:
        repo.run("worktree", "prune", check=False)
        repo.worktree_add(path, commit)
    return path


GPU_TESTS = "tests/gpu/"


def patch_tests(project: Project, tree: Path, ref: str, *, gpu_per_patch: bool = False) -> list[TestOutcome]:
    repo = Git(tree)
    base, head = repo.rev(BASE_REF), repo.rev(APPLIED_REF)
    if not base or not head:
        raise ToolError(f"{tree} was not built by `make apply`; run `make apply` first")
    patches = load_patches(project)
    commits = repo.commits(base, head)
    subjects = [repo.subject(c) for c in commits]
    if subjects != [sp.patch.subject for sp in patches]:
        raise ToolError(
            f"{tree} does not hold the current series ({len(commits)} commits vs {len(patches)} patches, "
            "or different subjects); run `make apply` (or `make refresh` if you changed the tree)"
        )
    wt_root = project.build_dir / "worktrees" / tree.name
    out = []
    counter = Counter(len(patches), "testing")
    for i, (sp, commit) in enumerate(zip(patches, commits, strict=False), start=1):
        counter.step(sp.path.name)
        label = f"{sp.path.name} (series up to #{i})"
        if not sp.patch.tests:
            out.append(TestOutcome(label, False, "declares no Tests"))
            continue
        tests = [t for t in sp.patch.tests if gpu_per_patch or not t.startswith(GPU_TESTS)]
        deferred = [t for t in sp.patch.tests if t not in tests]
        wt = patch_worktree(repo, wt_root, f"{i:02d}-{sp.path.stem}", commit)
        # Deferred GPU tests must still exist: collecting them starts no server.
        rc = _pytest(project, ["-q", "--collect-only", *deferred], wt) if deferred else 0
        if rc == 0 and tests:
            rc = _pytest(project, ["-q", *tests], wt)
        out.append(TestOutcome(label, rc == 0, "" if rc == 0 else _describe(rc)))
    return out


def gpu_tests(project: Project, tree: Path) -> TestOutcome | None:
    """The line's GPU suite (tests/gpu of the line's folder) on its full series."""
    suite = project.line_dir / "tests" / "gpu"
    if not suite.is_dir():
        logger.info(f"{suite.relative_to(project.root)} does not exist; skipping GPU tests")
        return None
    rc = _pytest(project, [str(suite.relative_to(project.root)), "-q"], tree)
    ok = rc in (0, PYTEST_NO_TESTS)  # GPU tests skip themselves on a machine without a GPU
    return TestOutcome("tests/gpu (full series)", ok, "" if ok else _describe(rc))


def run_tests(
    project: Project,
    tree: Path,
    ref: str,
    *,
    own: bool = True,
    extra: list[str] | None = None,
    gpu_per_patch: bool = False,
) -> list[TestOutcome]:
    outcomes = []
    if own:
        outcomes.append(own_tests(project, extra or []))
    outcomes.extend(patch_tests(project, tree, ref, gpu_per_patch=gpu_per_patch))
    g = gpu_tests(project, tree)
    if g:
        outcomes.append(g)
    return outcomes


def summarise(outcomes: list[TestOutcome]) -> None:
    bad = [o for o in outcomes if not o.ok]
    for o in outcomes:
        logger.info(f"  {'ok  ' if o.ok else 'FAIL'} {o.label}" + (f": {o.message}" if o.message else ""))
    if bad:
        raise TestFailure(
            f"{len(bad)} of {len(outcomes)} test group(s) failed: " + "; ".join(f"{o.label}: {o.message}" for o in bad)
        )
