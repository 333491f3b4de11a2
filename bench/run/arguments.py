"""The sweep's command line: `python -m bench [run] [options]` (bench.cli mounts it, bench.run.sweep runs it)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from bench.configs import CONFIGS, DEFAULT_CONFIGS, DEFAULT_PLAIN_CONFIGS, DEFAULT_UPSTREAM_CONFIGS
from bench.models import fixtures
from bench.results.profile import ProfileWindow
from bench.run import client

FULL_LEVELS = [1, 2, 5, 10, 30, 70, 100, 250]
QUICK_LEVELS = [1, 2, 10, 30, 100, 250]


def _levels(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("concurrency levels must be >= 1")
    return out


def _rates(text: str) -> list[float]:
    """--request-rates: requests/s > 0 each, or inf (all at once), as bench_serving's --request-rate."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        try:
            rate = float(item)
        except ValueError:
            rate = math.nan
        if not rate > 0:  # also NaN and the empty item of "2,,4"
            raise argparse.ArgumentTypeError(
                f"{item!r} is not a request rate: give requests per second > 0 or inf, comma-separated, "
                "e.g. --request-rates 2,4,8,16,32"
            )
        out.append(rate)
    return out


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _thresholds(text: str) -> tuple[int, int]:
    try:
        n, m = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("expected N,M (disable above N, enable at <= M)") from None
    if m > n or n < 0 or m < 0:
        raise argparse.ArgumentTypeError("need 0 <= M <= N")
    return n, m


def _add_model_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default=None, help="target model path (default: the generated fixture target)")
    ap.add_argument("--draft-model", default=None, help="EAGLE-3 draft path (default: the fixture draft)")
    ap.add_argument(
        "--fixture-pair",
        choices=["exact", "random", "trained", "trained-gpu-bound", "kimi-exact", "kimi-random"],
        default=None,
        help="fixture models when --model is not given (default: the preset's own; exact: near-100%% "
        "acceptance, random: near 0, trained: a trained target and draft)",
    )
    ap.add_argument(
        "--fixture-preset",
        choices=sorted(fixtures.PRESETS),
        default="tiny",
        help="fixture models when --model is not given: tiny (H=512, 8 layers; the server's CPU work "
        "dominates a step), gpu-bound (Llama-3-8B shape, drawn on the GPU, exact pair only), "
        "gpu-bound-deep (the same with 64 layers: the draft half as large next to it), trained "
        "(a target trained on a code corpus with a trained EAGLE-3 draft; made on the GPU in a few "
        "minutes), trained-gpu-bound (its trained layers followed by pass-through layers: an 8B "
        "model's step cost, the same outputs) or kimi (Kimi-K2.5's architecture, tiny: MLA and MoE "
        "under the KimiK25 wrapper; pick the MLA backend with --extra-flags)",
    )


def _add_profile_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--profile-at",
        type=_levels,
        default=None,
        help="after each config's levels, profile PROFILE_STEPS decode steps of one wave at each of "
        "these concurrencies (comma-separated; SGLang's /start_profile) and report GPU idle "
        "time and the top CPU ops",
    )
    ap.add_argument("--profile-steps", type=_positive, default=40, help="steps to profile (default %(default)s)")
    ap.add_argument(
        "--profile-window",
        choices=[w.value for w in ProfileWindow],
        default=ProfileWindow.FULL_BATCH.value,
        help="full-batch: decode steps once the wave's batch is full (default); wave-start: the "
        "wave's first steps, its prefill batches included (where a level's wave boundaries go)",
    )
    ap.add_argument(
        "--profile-stacks",
        action="store_true",
        help="trace Python stacks too, and report the host's kernel launches, copies and syncs under "
        "each SGLang function that made them (which code a speculating server's extra host time "
        "is); the host runs slower traced, so read counts from it, not times; profile fewer steps",
    )
    ap.add_argument("--keep-traces", action="store_true", help="keep the profiler traces (OUT/profiles; large)")


DESCRIPTION = "Concurrency sweep: no-spec vs EAGLE-3 vs the switch."


def epilog() -> str:
    return "configs: " + "; ".join(f"{c.name}: {c.help}" for c in CONFIGS.values())


def parser() -> argparse.ArgumentParser:
    """The sweep's arguments alone (bench.cli mounts the same as its `run` command)."""
    ap = argparse.ArgumentParser(prog="python -m bench run", description=DESCRIPTION, epilog=epilog())
    add_arguments(ap)
    return ap


def add_arguments(ap: argparse.ArgumentParser) -> None:
    _add_sweep_args(ap)
    _add_server_args(ap)
    _add_model_args(ap)
    _add_profile_args(ap)
    ap.add_argument("--out", type=Path, default=None, help="default build/bench/<timestamp>")
    ap.add_argument(
        "--ref",
        default=None,
        help="the release line to benchmark, as make's SGLANG_REF (default: the pinned one, v0.5.9)",
    )
    ap.add_argument(
        "--tree", default=None, help="patched SGLang tree (default $SGLANG_TREE, else the tree of --ref's line)"
    )


def _add_sweep_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--configs",
        default=None,
        help=f"comma-separated (default {','.join(DEFAULT_CONFIGS)}; on a tree without the switch "
        f"{','.join(DEFAULT_UPSTREAM_CONFIGS)}, without --speculative-adaptive either "
        f"{','.join(DEFAULT_PLAIN_CONFIGS)})",
    )
    ap.add_argument(
        "--concurrency", type=_levels, default=None, help=f"levels (default {FULL_LEVELS}; --quick {QUICK_LEVELS})"
    )
    ap.add_argument(
        "--num-requests",
        type=_positive,
        default=None,
        help="requests per level, at least WAVES x the level (default 30; --quick 10); with "
        f"--request-rates also the requests per rate (default {DEFAULT_RATE_REQUESTS})",
    )
    _add_open_loop_args(ap)
    ap.add_argument(
        "--waves",
        type=_positive,
        default=None,
        help="each level sends at least WAVES x concurrency requests (default 3; --quick 1): a level "
        "of one wave at high concurrency lasts about a second and is noise",
    )
    ap.add_argument(
        "--repeat",
        metavar="CONFIGS",
        default=None,
        help="serve each of these configs (comma-separated, of --configs) once more at the end of the "
        "run, as CONFIG-again, and report its second/first ratio per level or rate: the run-to-run "
        "noise a comparison within the run must beat (two speculating servers differ more than two "
        "plain ones: repeat both kinds to judge a ratio between them)",
    )
    ap.add_argument(
        "--without",
        metavar="PATCH",
        default=None,
        help="serve each speculating config once more from a copy of the tree with this one patch "
        "undone (a patch of --ref's series by number or file name, or a patch file), as "
        "CONFIG-without-NNNN, and report its ratio to CONFIG per level or rate: the patch's own effect, "
        "measured side by side; refused when later patches build on its lines",
    )
    ap.add_argument(
        "--without-configs",
        metavar="CONFIGS",
        default=None,
        help="the configs (comma-separated, of --configs) --without serves again (default: the "
        "speculating ones; name nospec too for a patch that changes plain serving, such as 0001)",
    )
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default 512 (--quick 128)")
    ap.add_argument(
        "--output-len-spread",
        type=float,
        default=0.0,
        metavar="S",
        help="closed loop: each request's max-new-tokens drawn uniformly from (1 - S) to (1 + S) times "
        "--max-new-tokens (0 <= S < 1; default 0: all equal, so a plain server's requests finish "
        "whole waves at one step and are prefilled together, a speculating one's do not); the same "
        "draws for every config and run",
    )
    ap.add_argument(
        "--freeze-gc",
        action="store_true",
        help="after each server's warm-up, freeze its garbage collector (SGLang's /freeze_gc, as for production serving), so that no full collection over the start-up objects pauses a measured level; every config alike",
    )
    ap.add_argument(
        "--quick", action="store_true", help="fewer levels, requests and tokens (fits a 10-minute device call)"
    )
    ap.add_argument(
        "--prompts",
        type=Path,
        default=None,
        help=f"prompt file (.jsonl/.json/.txt; default {client.DEFAULT_PROMPTS.name})",
    )
    ap.add_argument(
        "--then-prompts",
        type=Path,
        default=None,
        help="after each config's levels (and rates and profiles), serve its --concurrency levels again on "
        "the same server with these prompts: traffic whose acceptance differs (e.g. "
        f"bench/data/{client.DEFAULT_PROMPTS.name} after a trained set's code snippets), which a learning "
        "switch (auto) must follow; reported as CONFIG-then, compared with its references' own -then",
    )
    ap.add_argument(
        "--then-again",
        action="store_true",
        help="as --then-prompts with the run's own prompts: each config's levels again on the server they "
        "ran on, so that what the levels did to it (a server that speculated at large batches) shows "
        "beside its fresh first pass",
    )
    ap.add_argument("--chat-template", action="store_true", help="wrap prompts with the model's chat template")


DEFAULT_RATE_REQUESTS = 100


def _add_open_loop_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--request-rates",
        type=_rates,
        default=None,
        help="open loop: for each of these rates (requests/s, comma-separated, inf: all at once) send "
        "requests at Poisson arrivals, as `python -m sglang.bench_serving --request-rate`, and report "
        "output tok/s, TTFT, TPOT and ITL; on each config's server after its --concurrency levels "
        "(none unless --concurrency is given too)",
    )
    ap.add_argument(
        "--rate-duration",
        type=_seconds,
        default=None,
        help="instead of --num-requests: send each rate's arrivals for about this many seconds "
        "(ceil(rate x seconds) requests; finite rates only)",
    )
    ap.add_argument(
        "--rate-settle",
        type=_seconds,
        default=None,
        help="before each rate's measured requests, send this many seconds of its arrivals that are "
        "not measured (ceil(rate x seconds) requests, the same Poisson process): the rate is then "
        "measured in its steady state, its batch built up and a learning switch (auto) past its first "
        "visits of the batch sizes the rate brings; every config alike (finite rates only)",
    )
    ap.add_argument("--seed", type=int, default=None, help="the arrivals' seed, as bench_serving's --seed (default 1)")


def _add_server_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--extra-flags", default="", help="extra server flags for every config (one string)")
    ap.add_argument(
        "--max-running-requests",
        type=int,
        default=256,
        help="passed to every config (SGLang caps speculative servers at 48 otherwise)",
    )
    ap.add_argument(
        "--switch-thresholds",
        type=_thresholds,
        default=None,
        help="N,M for the switch configs (default: recommended from this run's nospec/spec sweeps)",
    )
    ap.add_argument("--thresholds-from", type=Path, default=None, help="results.json whose recommendation to use")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument(
        "--no-ignore-eos", action="store_true", help="stop at EOS (default: always generate max-new-tokens)"
    )
    ap.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="seconds; start no new config after this, or one that could not finish in what is left "
        "at the pace of the fastest config so far",
    )
    ap.add_argument("--startup-timeout", type=float, default=900.0)


def parse(argv: list[str]) -> argparse.Namespace:
    """The benchmark's arguments. `--extra-flags VALUE` keeps VALUE even when it is one server flag
    such as `--disable-piecewise-cuda-graph`, which argparse would otherwise read as an option of
    the benchmark's own and refuse ("expected one argument")."""
    return parser().parse_args(bind_extra_flags(argv))


def bind_extra_flags(argv: list[str]) -> list[str]:
    bound: list[str] = []
    args = iter(argv)
    for arg in args:
        value = next(args, None) if arg == "--extra-flags" else None
        bound.append(arg if value is None else f"{arg}={value}")
    return bound
