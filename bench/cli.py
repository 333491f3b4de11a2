"""`python -m bench`: the benchmark's commands, and the one place its errors become exit codes.

python -m bench [run] [--quick] [--configs nospec,spec,switch-v1,switch-v2] [--out DIR] ...
python -m bench report RESULTS.json|DIR [...] [--out DIR] [--logs DIR]
                                               # merge runs, redo table/plot/recommendation
python -m bench boundaries RUN [--logs DIR]    # what each level's wave boundaries cost
python -m bench fixtures [--preset P] [...]    # build the test models, print their folder
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

from bench.errors import BenchError, BenchUsageError
from bench.models import fixtures
from bench.results import boundaries, report_cli
from bench.run import arguments, sweep
from tools.logs import configure


@dataclass(frozen=True)
class Command:
    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    epilog: str | None = None


def commands() -> dict[str, Command]:
    return {
        "run": Command(
            "sweep the configs' concurrency levels (the default command)",
            arguments.DESCRIPTION,
            arguments.add_arguments,
            sweep.command,
            arguments.epilog(),
        ),
        "report": Command(
            "merge runs and redo their table, plot and recommendation",
            "merge results and redo table/plot/recommendation",
            report_cli.add_arguments,
            report_cli.command,
        ),
        "boundaries": Command(
            "what each level's wave boundaries cost, from a run's server logs",
            boundaries.DESCRIPTION,
            boundaries.add_arguments,
            boundaries.command,
        ),
        "fixtures": Command(
            "build (or find) a set of test models and print its folder",
            fixtures.DESCRIPTION,
            fixtures.add_arguments,
            fixtures.command,
        ),
    }


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", help="debug messages too")
    ap = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmarks of the patched SGLang: concurrency sweeps, their reports, test models. "
        "Without a command, the options are the sweep's (`run`).",
    )
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, cmd in commands().items():
        p = sub.add_parser(name, help=cmd.help, description=cmd.description, epilog=cmd.epilog, parents=[common])
        cmd.add_arguments(p)
        p.set_defaults(handler=cmd.run)
    return ap


def with_command(argv: list[str]) -> list[str]:
    """argv with `run` in front when it names no command: `python -m bench --quick` as before the
    commands had names (the Makefile's bench target and the GPU scripts call it so)."""
    if argv and (argv[0] in commands() or argv[0] in ("-h", "--help")):
        return argv
    if argv and not argv[0].startswith("-"):
        # The sweep takes options only: a first word is a command, misspelt or unknown.
        raise BenchUsageError(f"no command {argv[0]!r}; the commands: {', '.join(commands())}")
    return ["run", *argv]


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(
            arguments.bind_extra_flags(with_command(list(sys.argv[1:] if argv is None else argv)))
        )
        configure(verbose=args.verbose, root_logger="bench")
        return int(args.handler(args))
    except BenchUsageError as e:
        print(f"bench: usage: {e}", file=sys.stderr)
        return 2
    except BenchError as e:
        print(f"bench: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
