"""Where a level's time went between its full-batch decode steps, from a server's own log.

`python -m bench boundaries RUN [--logs DIR|TGZ]` reads a run's results.json and its servers' logs
(a folder, or the packed .tgz the GPU machine's script sends back) and prints, per config and level:
the steady decode intervals at a batch of C (the level's step cost), the intervals that follow a
prefill at that batch (which hold the wave boundaries), the decode lines at smaller batches (a wave
that filled slowly), the prefill batches with their new and cached tokens, the switch's turns, and
what each prefill batch added to an interval at C beyond a steady one of the same kind of step
(plain or speculative: a speculating server's prefill carries the draft's). It is the decomposition
docs/measurements.md did by hand for the levels that missed. SGLang logs a decode line every
`--decode-log-interval` steps (40 by default), and its `gen throughput` counts the tokens the
interval's steps gave (accept len per request on a speculative step, one on a plain one), so an
interval's seconds are steps x C x tokens per request and step / its `gen throughput`; for an
interval that holds a wave boundary this overstates the time, as some of its steps ran at a smaller
batch, alike on every server of the run. (Until 2026-12-04 the speculative steps' accept len was
left out, which understated their intervals by it.)

The bench flushes the server's cache before each level, and the server logs each flush: the log
between two flushes is one level (the warm-up before the first is dropped, and so is the first
level's first decode line). A profile after the levels is cut off where the server starts its
profiler, which leaves the start of a full-batch profile's wave in the last level. A second traffic
(`--then-prompts`, CONFIG-then) is read from CONFIG's log, past the parts of its levels and rates
(the bench flushes before each rate too).
"""

from __future__ import annotations

import argparse
import itertools
import re
import statistics
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.configs import first_traffic_name
from bench.errors import BenchUsageError
from bench.results.decode_rate import Interval, intervals
from bench.results.logparse import DecodeLine, before_profile, parse_log
from bench.results.records import read_results

FLUSHED = "Cache flushed successfully"
SGLANG_DECODE_LOG_INTERVAL = 40
_PREFILL = re.compile(r"Prefill batch\b.*?#new-token:\s*(?P<new>\d+),\s*#cached-token:\s*(?P<cached>\d+)")


@dataclass(frozen=True)
class LevelLog:
    """One level's part of a server log (rank 0)."""

    concurrency: int
    steady_s: tuple[float, ...]  # steady decode intervals at bs = C, seconds each
    after_prefill_s: tuple[float, ...]  # intervals at bs = C that follow a prefill
    smaller_batches: tuple[int, ...]  # batch sizes of the decode lines below C
    prefills: int
    new_tokens: int
    cached_tokens: int
    turns: tuple[tuple[str, int], ...]  # the switch's ("ON"|"OFF", batch size), in order
    # What each prefill batch added to an interval at bs = C (after a line at C), beyond the median
    # steady interval of the same kind of step: seconds per prefill batch, plain and speculative.
    plain_per_prefill_s: tuple[float, ...] = ()
    spec_per_prefill_s: tuple[float, ...] = ()


def level_parts(text: str, count: int) -> list[str]:
    """The log's part for each of `count` levels: what follows each of the first `count` flushes.

    A run cut off inside a level (the device's time limit) flushed once more than it recorded levels:
    that last part belongs to no level of results.json."""
    parts = text.split(FLUSHED)[1:]
    if len(parts) < count:
        raise BenchUsageError(f"the server log holds {len(parts)} cache flushes, not one per level ({count})")
    return [before_profile(part) for part in parts[:count]]


def level_parts_if_cut(text: str, count: int) -> list[str] | None:
    """level_parts, or None when the log does not hold one part per level (a server started without
    the bench's flushes)."""
    try:
        return level_parts(text, count)
    except BenchUsageError:
        return None


def prefill_batch_count(part: str) -> int:
    return len(_prefill_batches(part))


def prefill_batches_by_level(text: str, count: int) -> list[int] | None:
    """The prefill batches in each of `count` levels' parts of the log; None when it is not cut so."""
    parts = level_parts_if_cut(text, count)
    return None if parts is None else [prefill_batch_count(part) for part in parts]


def _prefill_batches(part: str) -> list[re.Match[str]]:
    """The log part's prefill batch lines, matched."""
    return [m for m in map(_PREFILL.search, part.splitlines()) if m]


def level_log(part: str, concurrency: int, steps_per_line: int, first: bool = False) -> LevelLog:
    """first: the run's first level, whose first decode line's interval reaches back to the server's
    start or into the warm-up's short waves; a later level's first interval holds only the end of
    the level before it, as any wave boundary does."""
    rank0 = parse_log(part).get(0)
    decode = rank0.decode[1 if first else 0 :] if rank0 else []
    ivs = intervals(decode, from_start=False)
    # (seconds of the interval, whether it held decode steps only) of each line at bs = C
    at_c = [
        (_seconds(iv, concurrency, steps_per_line), iv.steady)
        for iv in ivs
        if iv.batch_size == concurrency and iv.tok_per_s
    ]
    per_prefill = _per_prefill_batch(decode, ivs, concurrency, steps_per_line)
    prefills = _prefill_batches(part)
    return LevelLog(
        concurrency=concurrency,
        steady_s=tuple(s for s, steady in at_c if steady),
        after_prefill_s=tuple(s for s, steady in at_c if not steady),
        smaller_batches=tuple(d.batch_size for d in decode if d.batch_size < concurrency),
        prefills=len(prefills),
        new_tokens=sum(int(m.group("new")) for m in prefills),
        cached_tokens=sum(int(m.group("cached")) for m in prefills),
        turns=tuple(rank0.events) if rank0 else (),
        plain_per_prefill_s=per_prefill[False],
        spec_per_prefill_s=per_prefill[True],
    )


def _seconds(iv: Interval, concurrency: int, steps_per_line: int) -> float:
    """The interval's duration: its tokens (steps x C x tokens per request and step) / its rate."""
    assert iv.tok_per_s
    return steps_per_line * concurrency * iv.tokens_per_request / iv.tok_per_s


def _per_prefill_batch(
    decode: list[DecodeLine], ivs: list[Interval], concurrency: int, steps_per_line: int
) -> dict[bool, tuple[float, ...]]:
    """Per kind of step (speculative or not): each interval at bs = C that followed a line at C, ran
    one kind of step and held prefill batches, less the median steady interval of that kind, per
    prefill batch. What a lone prefill costs a server decoding at C (its own prefill and, on a
    speculative server, the draft's), measured the same way for every server."""
    timed = [
        (iv.spec_steps > 0, _seconds(iv, concurrency, steps_per_line), line.prefills)
        for before, line, iv in zip(decode, decode[1:], ivs[1:], strict=False)
        if before.batch_size == line.batch_size == concurrency
        and iv.tok_per_s
        and not (iv.spec_steps and iv.plain_steps)
    ]
    out: dict[bool, tuple[float, ...]] = {}
    for speculative in (False, True):
        steady = [s for kind, s, n in timed if kind == speculative and not n]
        base = statistics.median(steady) if steady else None
        out[speculative] = (
            () if base is None else tuple((s - base) / n for kind, s, n in timed if kind == speculative and n)
        )
    return out


def markdown(config: str, levels: list[LevelLog], steps_per_line: int) -> list[str]:
    out = [
        f"`{config}`:",
        "",
        f"| C | steady {steps_per_line}-step intervals at bs = C: n, median s | after a prefill, s | "
        "decode lines below C (least bs) | prefill batches: n, new / cached tokens | switch turns | "
        "per prefill batch beyond a steady interval, median ms (n): plain / speculative |",
        "|---|---|---|---|---|---|---|",
    ]
    for lv in levels:
        steady = f"{len(lv.steady_s)}, {statistics.median(lv.steady_s):.4f}" if lv.steady_s else "0"
        after = ", ".join(f"{s:.3f}" for s in lv.after_prefill_s)
        smaller = f"{len(lv.smaller_batches)} ({min(lv.smaller_batches)})" if lv.smaller_batches else "0"
        turns = ", ".join(f"{d} at {bs}" for d, bs in lv.turns)
        per_prefill = " / ".join(_median_ms(v) for v in (lv.plain_per_prefill_s, lv.spec_per_prefill_s))
        out.append(
            f"| {lv.concurrency} | {steady} | {after} | {smaller} | "
            f"{lv.prefills}, {lv.new_tokens} / {lv.cached_tokens} | {turns} | {per_prefill} |"
        )
    return out + [""]


def _median_ms(seconds: tuple[float, ...]) -> str:
    return f"{statistics.median(seconds) * 1000:.1f} ({len(seconds)})" if seconds else "-"


def read_log(logs: Path, config: str) -> str:
    """A config's server log from a folder of logs, or from a tar archive of them (any compression)."""
    if logs.is_dir():
        path = logs / f"{config}.log"
        if not path.is_file():
            raise BenchUsageError(f"no server log for {config} at {path} (give the folder with --logs)")
        return path.read_text(errors="replace")
    try:
        with tarfile.open(logs) as tar:
            names = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(f"logs/{config}.log")]
            member = tar.extractfile(names[0]) if len(names) == 1 else None
            if member is None:
                raise BenchUsageError(f"{logs} holds {len(names)} logs/{config}.log, not one")
            return member.read().decode(errors="replace")
    except (OSError, tarfile.TarError) as e:
        raise BenchUsageError(f"--logs {logs}: neither a folder of logs nor a readable .tgz ({e})") from None


DESCRIPTION = __doc__.split("\n\n")[0]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("run", type=Path, help="a run's folder (results.json) or its results.json")
    ap.add_argument(
        "--logs",
        type=Path,
        default=None,
        help="the servers' logs (<config>.log), a folder or a tar archive of logs/<config>.log (the .tgz the device sends back, a .tar.xz); default RUN/logs",
    )
    ap.add_argument(
        "--decode-log-interval",
        type=int,
        default=None,
        help=f"the servers' (default: as the run's extra flags set it, else SGLang's {SGLANG_DECODE_LOG_INTERVAL})",
    )


def logged_interval(meta: dict[str, Any]) -> int:
    """The decode steps per log line the run's servers used: its --extra-flags' or SGLang's default."""
    flags = str(meta.get("extra_flags") or "").split()
    for flag, value in itertools.pairwise(flags):
        if flag == "--decode-log-interval" and value.isdigit():
            return int(value)
    for flag in flags:
        if flag.startswith("--decode-log-interval=") and flag.split("=", 1)[1].isdigit():
            return int(flag.split("=", 1)[1])
    return SGLANG_DECODE_LOG_INTERVAL


def command(args: argparse.Namespace) -> int:
    """`python -m bench boundaries`; errors go to bench.cli.main, which maps them to exit codes."""
    path = args.run / "results.json" if args.run.is_dir() else args.run
    logs = args.logs or path.parent / "logs"
    if not path.is_file():
        raise BenchUsageError(f"boundaries: no results at {path}")
    run, _ = read_results(path)
    steps_per_line = args.decode_log_interval or logged_interval(run.meta)
    out: list[str] = []
    for name, config in run.configs.items():
        levels = [lv.concurrency for lv in config.levels]
        first_traffic = first_traffic_name(name)
        if first_traffic is None:
            parts = level_parts(read_log(logs, name), len(levels))
        else:  # the second traffic's levels follow the first's levels and rates in its server's log
            first = run.configs[first_traffic]
            before = len(first.levels) + len(first.rates)
            parts = level_parts(read_log(logs, first_traffic), before + len(levels))[before:]
        logs_by_level = [
            level_log(p, c, steps_per_line, first=i == 0 and first_traffic is None)
            for i, (p, c) in enumerate(zip(parts, levels, strict=True))
        ]
        out += markdown(name, logs_by_level, steps_per_line)
    print("\n".join(out))
    return 0
