"""What one run of the sweep is, fixed once from its command line: the settings of every config's
sweep and the target (tree, models, prompts, output folder)."""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.errors import BenchUsageError
from bench.models import fixtures
from bench.results import profile
from bench.run import client
from bench.run.arguments import DEFAULT_RATE_REQUESTS, FULL_LEVELS, QUICK_LEVELS


@dataclass(frozen=True)
class RunSettings:
    """What each config's sweep does, fixed once from the command line (the --quick defaults applied)."""

    levels: tuple[int, ...]
    num_requests: int  # per level, at least waves x the level
    waves: int
    max_new_tokens: int
    temperature: float
    ignore_eos: bool
    tp: int
    max_running_requests: int
    extra_flags: str  # for every config's server, one string
    switch_thresholds: tuple[int, int] | None  # N, M for the switch configs; None: from a recommendation
    thresholds_from: Path | None  # results.json whose recommendation to use
    profile_at: tuple[int, ...]  # profile one wave at each of these concurrencies after the levels
    profile_steps: int
    profile_window: profile.ProfileWindow
    profile_stacks: bool  # trace Python stacks: host calls by SGLang function
    keep_traces: bool
    freeze_gc: bool  # POST /freeze_gc after each server's warm-up
    # The open loop (bench.run.open_loop), after the levels; empty: none.
    request_rates: tuple[float, ...] = ()
    rate_requests: int = DEFAULT_RATE_REQUESTS  # per rate, unless rate_duration
    rate_duration: float | None = None  # seconds of arrivals per rate instead
    rate_settle: float = 0.0  # seconds of unmeasured arrivals before each rate's measured ones
    seed: int = 1
    output_len_spread: float = 0.0  # closed loop: max_new_tokens spread (output_lengths)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunSettings:
        quick = args.quick
        rates = _open_loop_args(args)
        closed = args.concurrency or ([] if rates else QUICK_LEVELS if quick else FULL_LEVELS)
        return cls(
            levels=tuple(closed),
            num_requests=args.num_requests if args.num_requests is not None else (10 if quick else 30),
            waves=args.waves if args.waves is not None else (1 if quick else 3),
            max_new_tokens=args.max_new_tokens or (128 if quick else 512),
            temperature=args.temperature,
            ignore_eos=not args.no_ignore_eos,
            tp=args.tp,
            max_running_requests=args.max_running_requests,
            extra_flags=args.extra_flags,
            switch_thresholds=args.switch_thresholds,
            thresholds_from=args.thresholds_from,
            profile_at=tuple(args.profile_at or ()),
            profile_steps=args.profile_steps,
            profile_window=profile.ProfileWindow(args.profile_window),
            profile_stacks=args.profile_stacks,
            keep_traces=args.keep_traces,
            freeze_gc=args.freeze_gc,
            request_rates=tuple(rates),
            rate_requests=args.num_requests or DEFAULT_RATE_REQUESTS,
            rate_duration=args.rate_duration,
            rate_settle=args.rate_settle or 0.0,
            seed=1 if args.seed is None else args.seed,
            output_len_spread=_output_len_spread(args.output_len_spread),
        )

    def output_lengths(self, concurrency: int, requests: int) -> list[int] | None:
        """Each request's max_new_tokens at a level (None: all --max-new-tokens): uniform over
        (1 -/+ spread) x max_new_tokens, drawn from a seed of the level's, so that every config of
        a run, and every run, sends the same lengths."""
        if not self.output_len_spread:
            return None
        rng = random.Random(f"output-lengths:{concurrency}:{requests}")
        low, high = (
            (1 - self.output_len_spread) * self.max_new_tokens,
            (1 + self.output_len_spread) * self.max_new_tokens,
        )
        return [max(1, round(rng.uniform(low, high))) for _ in range(requests)]

    def requests_for_rate(self, rate: float) -> int:
        if self.rate_duration is None:
            return self.rate_requests
        return max(1, math.ceil(rate * self.rate_duration))

    def settling_requests(self, rate: float) -> int:
        """The requests sent at a rate before its measured ones (0 without --rate-settle)."""
        return math.ceil(rate * self.rate_settle) if self.rate_settle else 0

    @property
    def warm_up_top(self) -> int:
        """The largest batch the warm-up reaches: the largest level, or for the open loop alone (whose
        batch the arrivals decide) as many requests as one rate sends, up to the server's cap."""
        if self.levels:
            return max(self.levels)
        most = max((self.requests_for_rate(r) for r in self.request_rates), default=1)
        return max(1, min(most, self.max_running_requests))

    @property
    def sampling(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "max_new_tokens": self.max_new_tokens, "ignore_eos": self.ignore_eos}


def _output_len_spread(spread: float) -> float:
    if not 0 <= spread < 1:
        raise BenchUsageError(f"--output-len-spread must be at least 0 and below 1, got {spread:g}")
    return spread


def _open_loop_args(args: argparse.Namespace) -> list[float]:
    """--request-rates, checked against the options that go with it."""
    rates: list[float] = args.request_rates or []
    if not rates:
        for flag, value in (
            ("--rate-duration", args.rate_duration),
            ("--rate-settle", args.rate_settle),
            ("--seed", args.seed),
        ):
            if value is not None:
                raise BenchUsageError(
                    f"{flag} sets the open loop's arrivals: give --request-rates too, or leave it out"
                )
    if args.rate_settle is not None and any(math.isinf(r) for r in rates):
        raise BenchUsageError("--rate-settle needs finite --request-rates (inf has no arrivals to settle on): drop inf")
    if args.rate_duration is not None:
        if args.num_requests is not None:
            raise BenchUsageError("--rate-duration and --num-requests both set the requests per rate: give one of them")
        if any(math.isinf(r) for r in rates):
            raise BenchUsageError(
                "--rate-duration needs finite --request-rates (inf sends everything at once): "
                "drop inf, or give --num-requests instead"
            )
    return rates


@dataclass(frozen=True)
class RunTarget:
    """What the configs' servers serve and are sent, and where the run writes."""

    tree: Path
    model: str
    draft: str | None
    prompts: tuple[str, ...]
    out: Path
    prompts_file: str  # where the prompts came from, for the run's meta
    # The second traffic (--then-prompts): its prompts and file; empty: none.
    then_prompts: tuple[str, ...] = ()
    then_prompts_file: str | None = None

    def prompts_for_level(self, n: int, offset: int = 0) -> list[str]:
        return client.prompts_for_level(list(self.prompts), n, offset)


def requests_for_level(num_requests: int, waves: int, concurrency: int) -> int:
    return max(num_requests, waves * concurrency)


def run_target(args: argparse.Namespace, tree: Path, out: Path) -> RunTarget:
    """The models (the fixtures unless --model) and the prompts."""
    model, draft, prompts_file = args.model, args.draft_model, args.prompts
    if model is None:
        fx = fixtures.generate(fixtures.PRESETS[args.fixture_preset])
        t, d = fx.pair(args.fixture_pair or fixtures.default_pair(args.fixture_preset))
        model, draft = str(t), draft or str(d)
        # A trained set's own held-out prompts: hundreds, so no wave holds one prompt twice (the
        # shared set's 38 would, and whether two such requests share KV depends on timing).
        prompts_file = prompts_file or fx.prompts_file()
    prompts = _prompts("--prompts", prompts_file, model, args.chat_template)
    prompts_name = str(prompts_file or client.DEFAULT_PROMPTS.name)
    then, then_file = _second_traffic(args, model, prompts, prompts_name)
    return RunTarget(tree, model, draft, tuple(prompts), out, prompts_name, tuple(then), then_file)


def _second_traffic(
    args: argparse.Namespace, model: str, prompts: list[str], prompts_name: str
) -> tuple[list[str], str | None]:
    """--then-prompts' prompts and file, or --then-again's (the run's own); none without either."""
    flag = "--then-again" if args.then_again else "--then-prompts"
    if args.then_again and args.then_prompts:
        raise BenchUsageError("--then-again serves the run's own prompts again: leave --then-prompts out")
    if not (args.then_again or args.then_prompts):
        return [], None
    if args.request_rates and not args.concurrency:
        raise BenchUsageError(f"{flag} serves the --concurrency levels again: give --concurrency too")
    if args.then_again:
        return prompts, f"{prompts_name} (again)"
    return _prompts(flag, args.then_prompts, model, args.chat_template), str(args.then_prompts)


def _prompts(flag: str, path: Path | str | None, model: str, chat_template: bool) -> list[str]:
    try:
        prompts = client.load_prompts(path)
    except (OSError, ValueError) as e:
        raise BenchUsageError(f"{flag}: {e}") from None
    return client.apply_chat_template(prompts, model) if chat_template else prompts
