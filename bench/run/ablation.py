"""`--without PATCH`: a patch's own effect, measured in the run that measures the rest. Each
speculating config (or each that --without-configs names) is served a second time from a copy of
the tree with that one patch undone, as CONFIG-without-NNNN, its ratio to CONFIG reported per
level (as a repeat's is): two bundles in two runs would compare across runs, whose noise is
larger than most patches' effects."""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from bench.configs import Config
from bench.errors import BenchUsageError
from bench.run.server import PROJECT_ROOT

logger = logging.getLogger(__name__)

WITHOUT = "-without-"
# What a server imports from a tree; a patch's files elsewhere (tests, docs) are not served.
SERVED = "python/"


@dataclass(frozen=True)
class Ablation:
    patch: str  # the series file name
    label: str  # its number, for the twins' names
    tree: Path  # the run's tree with the patch undone


def find_patch(ref: str | None, spec: str) -> Path:
    """A patch file's path, or a patch of --ref's series named by its file name or number."""
    from tools.apply import resolve_ref
    from tools.project import Project
    from tools.series import read_series

    if Path(spec).is_file():
        return Path(spec).resolve()
    project = Project(PROJECT_ROOT).line_for(ref)
    names = read_series(project.series_path).names
    found = [n for n in names if n == spec or n.split("-", 1)[0] == spec]
    if len(found) != 1:
        line = resolve_ref(project, ref)
        raise BenchUsageError(
            f"--without {spec}: {'no patch' if not found else 'more than one patch'} of the {line} series "
            f"matches it ({', '.join(found or names)}); name one by its number or file name, or give a "
            "patch file's path (--ref picks the line)"
        )
    return project.patches_dir / found[0]


def tree_without(tree: Path, patch_file: Path, workdir: Path) -> Ablation:
    """A copy of the tree's served files with patch_file undone; refused, with every hunk that does
    not come off where it says or where later patches moved it, when one rewrote its lines."""
    from tools.dirpatch import apply_to_directory
    from tools.errors import ToolError
    from tools.patchfile import Patch, read_patch, reversed_patch

    patch = read_patch(patch_file)
    served = tuple(fp for fp in patch.files if fp.path.startswith(SERVED))
    if not served:
        raise BenchUsageError(f"--without {patch.name}: it changes nothing under {SERVED}, which is what a server runs")
    copy = workdir / f"without-{patch.name.removesuffix('.patch')}"
    shutil.copytree(tree / SERVED, copy / SERVED, ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
    try:
        # Later patches move its lines (offsets); one that rewrote them stops it (no fuzz).
        apply_to_directory(reversed_patch(Patch(patch.name, patch.header, patch.fields, served)), copy, True)
    except ToolError as e:
        raise BenchUsageError(
            f"--without {patch.name}: it does not come off {tree} alone (a later patch builds on its "
            f"lines, or the tree is not of its series):\n{e}"
        ) from None
    left = sorted(fp.path for fp in patch.files if fp not in served)
    logger.info(
        f"--without {patch.name}: undone in {copy}"
        + (f" (not served, left as they are: {', '.join(left)})" if left else "")
    )
    return Ablation(patch.name, patch.name.removesuffix(".patch").split("-", 1)[0], copy)


def twins(cfgs: list[Config], ablation: Ablation, names: str | None = None) -> list[Config]:
    """The configs named (comma-separated; default: the speculating ones) again, served from the
    ablation's tree, each compared with itself."""
    wanted = [n.strip() for n in names.split(",") if n.strip()] if names else [c.name for c in cfgs if c.speculative]
    known = [c.name for c in cfgs]
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        raise BenchUsageError(
            f"--without {ablation.patch}: "
            + (
                f"{', '.join(unknown)} not among the run's configs"
                if unknown
                else "none of the run's configs speculates"
            )
            + f" ({', '.join(known)}); name them with --without-configs"
        )
    return [
        replace(
            c,
            name=c.name + WITHOUT + ablation.label,
            compare_to=(c.name,),
            tree=ablation.tree,
            help=f"{c.name} without {ablation.patch}",
        )
        for c in cfgs
        if c.name in wanted
    ]
