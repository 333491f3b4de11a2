"""`python -m bench report`: redraw or merge runs' reports, or lay a sweep's split runs side by side."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from bench.errors import BenchUsageError
from bench.results import split_runs
from bench.results.level_logs import with_decode_rates
from bench.results.records import RunResults, read_results
from bench.results.report import analyse, markdown, merge, write_all

logger = logging.getLogger(__name__)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("inputs", nargs="+", type=Path, help="results.json files or folders holding one")
    ap.add_argument("--out", type=Path, default=None, help="default: the first input's folder")
    ap.add_argument(
        "--logs", type=Path, default=None, help="folder of server logs (<config>.log) to take decode-step rates from"
    )
    ap.add_argument(
        "--split",
        metavar="TITLE",
        default=None,
        help="the inputs are parts of one sweep, each with its own nospec: write split.md and "
        "split.png (each ratio taken inside its own run) to --out instead of merging",
    )


def command(args: argparse.Namespace) -> int:
    """`python -m bench report`; errors go to bench.cli.main, which maps them to exit codes."""
    parts = []
    for p in args.inputs:
        f = p / "results.json" if p.is_dir() else p
        if not f.is_file():
            raise BenchUsageError(f"report: no results at {f}")
        parts.append(read_results(f)[0])  # the analysis is redone from the merged configs
    out = args.out or (args.inputs[0] if args.inputs[0].is_dir() else args.inputs[0].parent)
    if args.split is not None:
        return _write_split(args.inputs, parts, out, args.split)
    out.mkdir(parents=True, exist_ok=True)
    results = merge(*parts)
    if args.logs:
        missing = [n for n in results.configs if not (args.logs / f"{n}.log").is_file()]
        if missing:
            raise BenchUsageError(f"report: no server log for {', '.join(missing)} in {args.logs}")
        results.configs = {
            name: with_decode_rates(c, (args.logs / f"{name}.log").read_text(errors="replace"))
            for name, c in results.configs.items()
        }
    analysis, paths = write_all(results, out, plot=True)
    print(markdown(results, analysis))
    logger.info("wrote " + ", ".join(str(p) for p in paths.values() if p))
    return 0


def _write_split(inputs: list[Path], parts: list[RunResults], out: Path, title: str) -> int:
    labels = [(p if p.is_dir() else p.parent).name for p in inputs]
    if len(set(labels)) != len(labels):
        raise BenchUsageError(
            f"report --split: the runs are told apart by their folders' names, and these repeat: "
            f"{', '.join(labels)}; give each run its own folder name"
        )
    written = split_runs.write(
        [split_runs.Part(lbl, run, analyse(run)) for lbl, run in zip(labels, parts, strict=True)], out, title
    )
    print((out / "split.md").read_text(encoding="utf-8"))
    logger.info("wrote " + ", ".join(map(str, written)))
    return 0
