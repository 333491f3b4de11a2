"""Command line: ``python -m tools <command>``. One function per command; ``ToolError`` is mapped to
an exit code in one place (``main``)."""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from tools.checkout_lock import hold
from tools.errors import ToolError, UnsafeTreeError, UsageError
from tools.logs import configure
from tools.progress import count_summary
from tools.project import Project, default_root

logger = logging.getLogger(__name__)

# Commands that write the checkout's build/ or .cache/ (trees, scratch repositories, archives).
# `test` is not among them: the tool tests it runs call the toolkit on checkouts of their own.
LOCKED = frozenset({"apply", "refresh", "check", "status", "install", "rebase"})

TEMPLATE = """{subject}

Description:
 Why the patch exists and what breaks without it.
 .
 A second paragraph, if needed.
Applies-To: {ref}
Upstream-Status: not upstream
Drop-When: upstream fixes <what>
Tests:
 tests/patches/test_<name>.py::test_<what>
"""


def _tree(args: argparse.Namespace, project: Project) -> Path:
    from tools.apply import resolve_ref

    if args.tree:
        return Path(args.tree).resolve()
    return project.tree_for(resolve_ref(project, args.ref))


def cmd_apply(args: argparse.Namespace, project: Project) -> int:
    from tools.apply import apply_series

    out = apply_series(
        project,
        args.ref,
        Path(args.tree).resolve() if args.tree else None,
        allow_offset=args.allow_offset,
        force=args.force,
        relock=args.relock,
    )
    detail = count_summary((r.status.value for r in out.results), "empty series")
    print(
        f"applied {len(out.results)} patch(es) to {out.tree} at {out.ref} ({out.entry.source}, base {out.base[:12]}): {detail}"
    )
    if out.backup:
        print(f"previous work saved on branch {out.backup} in {out.tree}")
    return 0


def cmd_tree(args: argparse.Namespace, project: Project) -> int:
    """The tree a line's commands work on: what make, the benchmark and the GPU scripts all use."""
    print(_tree(args, project))
    return 0


def line_paths(args: argparse.Namespace, project: Project) -> dict[str, str | Path | None]:
    """The SGLang ref of the line --ref names and each of its paths, by the name `tools line`
    prints it under."""
    from tools.apply import resolve_ref

    return {
        "ref": resolve_ref(project, args.ref),
        "dir": project.line_dir,
        "series": project.series_path,
        "patches": project.patches_dir,
        "lock": project.lock_path,
        "tree": _tree(args, project),
        "requirements": project.line_requirements,
        "venv": project.line_venv if project.line_requirements else None,
        "gpu-wheels": project.gpu_wheels,
    }


def cmd_line(args: argparse.Namespace, project: Project) -> int:
    """A line's ref and paths, asked by make and the GPU scripts rather than spelt out in each:
    one path for a field (empty when the line has none), else `field<TAB>path` per line."""
    paths = line_paths(args, project)
    if args.field:
        print(paths[args.field] or "")
        return 0
    for name, path in paths.items():
        print(f"{name}\t{path or ''}")
    return 0


def cmd_refresh(args: argparse.Namespace, project: Project) -> int:
    from tools.export import export_tree

    out = export_tree(project, _tree(args, project), force=args.force)
    where = project.patches_dir.relative_to(project.root)
    for n in out.written:
        print(f"wrote {where}/{n}" + (" (new, appended to series)" if n in out.added else ""))
    print(f"refresh: {len(out.written)} written, {len(out.unchanged)} unchanged, {len(out.added)} new")
    return 0


def _lines(args: argparse.Namespace, project: Project) -> list[Project]:
    """The line a --ref names, or every line of the checkout when none is named."""
    return [project] if args.ref else project.all_lines()


def cmd_check(args: argparse.Namespace, project: Project) -> int:
    from tools.check import run_check

    lines = _lines(args, project)
    problems = []
    for line in lines:
        if len(lines) > 1:
            logger.info(f"== line {line.label}")
        problems += [f"{line.label}: {p}" if len(lines) > 1 else p for p in run_check(line, args.ref)]
    for p in problems:
        print(p)
    if problems:
        raise ToolError(f"check: {len(problems)} problem(s)")
    what = f"{len(lines)} line(s)" if len(lines) > 1 else "series"
    print(f"check: {what}, headers, exact application and export are all in order")
    return 0


def cmd_status(args: argparse.Namespace, project: Project) -> int:
    from tools.status import run_status

    extra = [r for r in (args.refs or "").replace(",", " ").split() if r]
    lines = _lines(args, project)
    for line in lines:
        if len(lines) > 1:
            print(f"\n### line {line.label}\n")
        print(run_status(line, args.ref, extra))
    return 0


def cmd_install(args: argparse.Namespace, project: Project) -> int:
    tree = _tree(args, project)
    if not (tree / "python").is_dir():
        raise ToolError(f"{tree} has no python/ folder; run `make apply` first")
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "-e", str(tree / "python")]
    logger.info("$ " + " ".join(cmd))
    if subprocess.run(cmd).returncode != 0:
        raise ToolError("pip install failed (see above); the environment's sglang was not changed by this tool")
    print(f"installed {tree}/python into {sys.prefix} (editable, no dependency changes)")
    return 0


def cmd_test(args: argparse.Namespace, project: Project) -> int:
    from tools.apply import resolve_ref
    from tools.testrun import run_tests, summarise

    ref = resolve_ref(project, args.ref)
    tree = _tree(args, project)
    if not tree.exists():
        raise ToolError(f"{tree} does not exist; run `make apply` first")
    summarise(
        run_tests(
            project, tree, ref, own=not args.patches_only, extra=args.pytest_args, gpu_per_patch=args.gpu_per_patch
        )
    )
    print("test: all passed")
    return 0


def cmd_new(args: argparse.Namespace, project: Project) -> int:
    from tools.apply import resolve_ref

    ref = resolve_ref(project, args.ref)
    tree = _tree(args, project)
    path = tree / ".git" / "sglang-patch-template"
    if not path.parent.exists():
        raise ToolError(f"{tree} does not exist; run `make apply` first")
    path.write_text(TEMPLATE.format(subject=args.subject, ref=ref))
    print(
        f"wrote a commit message template to {path}\n"
        f"make your change in {tree}, then:\n"
        f"  git -C {tree} add -A && git -C {tree} commit -t {path}\n"
        f"  make refresh   # writes patches/<slug>.patch and appends it to series"
    )
    return 0


def cmd_rebase(args: argparse.Namespace, project: Project) -> int:
    from tools.lines import discard, is_unfinished, start_line
    from tools.rebase import rebase_tree, run_rebase

    started = args.new_line and not (args.cont or args.abort or args.check)
    if started:
        project = start_line(project, args.to)
    elif (args.cont or args.abort) and is_unfinished(project.line_for(args.to)):
        project = project.line_for(args.to)  # the new line whose first rebase stopped
    elif project.line is not None and not args.check:
        raise UsageError(
            f"{project.label} is named by its release: make the {args.to} line with "
            f"`make rebase FROM={project.line} SGLANG_REF={args.to} NEW_LINE=1` instead of moving it"
        )
    try:
        rc = run_rebase(
            project,
            args.to,
            check=args.check,
            drop=args.drop,
            cont=args.cont,
            abort=args.abort,
            report=Path(args.report) if args.report else None,
        )
    except ToolError:
        if started and not rebase_tree(project, args.to).exists():
            logger.info(f"removed {discard(project)}: the new line did not start")
        elif started:  # a conflict keeps the new line for --continue or --abort
            logger.info(
                f"{project.label} holds the copy being ported; `make rebase SGLANG_REF={args.to} ABORT=1` removes it"
            )
        raise
    if args.abort and is_unfinished(project):
        logger.info(f"removed {discard(project)}: the new line never reached {args.to}")
    return rc


def _add_rebase(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    r = sub.add_parser("rebase", help="port the series to another SGLang ref (see README)")
    r.add_argument("--to", required=True, help="the new ref, e.g. v0.5.10")
    r.add_argument("--check", action="store_true", help="report only; change nothing")
    r.add_argument("--drop", action="store_true", help="confirm dropping patches found upstream/obsolete")
    r.add_argument(
        "--report",
        help="write the Markdown report here (default: docs/rebase/[<line>/]<ref>.md with "
        "--check, else build/rebase-<ref>.md)",
    )
    r.add_argument("--continue", dest="cont", action="store_true", help="continue after resolving a conflict")
    r.add_argument("--abort", action="store_true", help="abandon a rebase in progress")
    r.add_argument(
        "--new-line",
        action="store_true",
        help="make lines/<to>/ from the line --ref names (default: the default line) and port that copy; "
        "the source line is left as it is",
    )
    r.set_defaults(func=cmd_rebase)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools", description="Keep a quilt-style patch series against SGLang.")
    p.add_argument("--root", help="project root (default: this checkout)")
    p.add_argument(
        "--ref",
        help="SGLang ref, e.g. v0.5.9: the line lines/<ref> when there is one, else the default "
        "line at that ref (default: the default line's pinned ref; check and status: every line)",
    )
    p.add_argument("--tree", help="patched tree (default: build/sglang-<ref>)")
    p.add_argument("-v", "--verbose", action="store_true", help="also print debug records")
    sub = p.add_subparsers(dest="command", required=True)

    a = sub.add_parser("apply", help="build the patched tree (base commit + one commit per patch)")
    a.add_argument("--allow-offset", action="store_true", help="accept hunks that apply at an offset")
    a.add_argument("--force", action="store_true", help="save the tree's work on a backup branch, then apply")
    a.add_argument("--relock", action="store_true", help="resolve the ref afresh and rewrite sglang.lock")
    a.set_defaults(func=cmd_apply)

    p_refresh = sub.add_parser("refresh", help="write the tree's commits back to patches/")
    p_refresh.add_argument(
        "--force", action="store_true", help="overwrite patch files edited since the last apply/refresh"
    )
    p_refresh.set_defaults(func=cmd_refresh)
    sub.add_parser("check", help="verify series, headers, exact application, export").set_defaults(func=cmd_check)

    s = sub.add_parser("status", help="table of patches: hunks per version, Upstream-Status, Tests")
    s.add_argument("--refs", help="more versions for the matrix, e.g. v0.5.10,v0.5.15")
    s.set_defaults(func=cmd_status)

    sub.add_parser("install", help="pip install --no-deps -e <tree>/python").set_defaults(func=cmd_install)
    _add_line_info(sub)

    t = sub.add_parser("test", help="tool tests, then each patch's Tests on the series up to it")
    t.add_argument("--patches-only", action="store_true", help="skip the tool's own tests")
    t.add_argument(
        "--gpu-per-patch",
        action="store_true",
        help="also run each patch's declared GPU tests on its prefix of the series (by default "
        "they run once, on the full series)",
    )
    t.add_argument("pytest_args", nargs="*", help="extra arguments for the tool-test pytest run")
    t.set_defaults(func=cmd_test)

    n = sub.add_parser("new", help="write a commit message template for a new patch")
    n.add_argument("subject")
    n.set_defaults(func=cmd_new)

    _add_rebase(sub)
    return p


def _add_line_info(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    sub.add_parser("tree", help="print the patched tree of the line --ref names").set_defaults(func=cmd_tree)
    ln = sub.add_parser("line", help="print the paths of the line --ref names (one field, or all)")
    ln.add_argument(
        "field",
        nargs="?",
        choices=["ref", "dir", "series", "patches", "lock", "tree", "requirements", "venv", "gpu-wheels"],
        help="venv and requirements are empty for a line that uses .venv",
    )
    ln.set_defaults(func=cmd_line)


def error_label(e: ToolError) -> str:
    """The first word of the message says which failure it is, since make turns every exit code into 2."""
    if isinstance(e, UnsafeTreeError):
        return "error (exit 3: work would be lost)"
    if isinstance(e, UsageError):
        return "error (exit 2: usage)"
    return f"error (exit {e.exit_code})"


def check_refs(args: argparse.Namespace) -> None:
    from tools.versions import check_ref_name

    if args.ref:
        check_ref_name(args.ref, "--ref")
    if getattr(args, "to", None):
        check_ref_name(args.to, "--to")
    for ref in (getattr(args, "refs", None) or "").replace(",", " ").split():
        check_ref_name(ref, "--refs entry")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure(verbose=args.verbose)
    try:
        check_refs(args)
        project = Project(Path(args.root).resolve() if args.root else default_root()).line_for(args.ref)
        if args.command not in LOCKED:
            return int(args.func(args, project))
        with hold(project, f"python -m tools {args.command}"):
            return int(args.func(args, project))
    except PermissionError as e:
        where = e.filename or "a file of the checkout"
        print(
            f"error (exit 1): cannot write {where}: permission denied. Run as a user who may write the "
            "checkout's build/ and .cache/ (or make them writable), or use a checkout of your own.",
            file=sys.stderr,
        )
        return 1
    except ToolError as e:
        print(f"{error_label(e)}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
