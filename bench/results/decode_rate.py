"""A level's decode-step rate at bs = C from a server's log, at the acceptance of the level's traffic.

The rate is taken over steady intervals (decode steps only, one batch size: logparse.DecodeLine.steady).
On a speculative server in a closed loop those are rare and not representative: a prefill follows
each finished request, and requests finish at different steps, so the intervals without one are
those in which no request finished, whose acceptance ran above the level's (on an H200: median
accept len 2.88 over the 6 steady intervals of 51 at bs = 48, 2.63 over all 51). A
speculative step yields accept len x batch tokens for a step cost that does not depend on how
many drafts were accepted, so each steady interval's speculative steps are counted at the
acceptance of all decode lines at that batch size instead of at the interval's own; its plain
steps (a switch's fallback steps, a plain server's) are left as they are.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench.results.logparse import Counters, DecodeLine, before_profile, parse_log


@dataclass(frozen=True)
class Interval:
    """The decode steps a log line reports on, since the rank's previous decode line."""

    batch_size: int
    tok_per_s: float | None
    steady: bool
    accept_len: float | None  # over the interval's speculative steps only (the switch leaves fallback steps out)
    # The interval's speculative and plain steps. Without the switch's counters a line stands for one
    # step of one kind (every line closes the same --decode-log-interval steps): speculative when it
    # prints an accept len. Only the two counts' ratio and their sums over lines are used.
    spec_steps: int
    plain_steps: int

    @property
    def tokens_per_request(self) -> float:
        """Tokens per request and step over the interval: accept len on its speculative steps, one
        on its plain ones."""
        if self.accept_len is None:
            return 1.0
        if self.spec_steps == 0:
            return self.accept_len
        return (self.spec_steps * self.accept_len + self.plain_steps) / (self.spec_steps + self.plain_steps)


@dataclass(frozen=True)
class DecodeRates:
    """A batch size's steady intervals' rates, their speculative steps at `accept_len`."""

    rates: tuple[float, ...]
    accept_len: float | None  # all decode lines' at this batch size; None: none ran a speculative step


def intervals(lines: Sequence[DecodeLine], from_start: bool = True) -> list[Interval]:
    """One rank's decode lines, in log order, as intervals.

    from_start: the lines begin at the server's start, whence the switch counts; otherwise (a part
    of a log) the first line with counters has none to count from and is taken as a line without."""
    out = []
    previous: Counters | None = Counters() if from_start else None
    for d in lines:
        if d.counters is not None and previous is not None:
            spec = d.counters.spec_steps - previous.spec_steps
            plain = d.counters.fallback_steps - previous.fallback_steps
        else:
            spec, plain = (1, 0) if d.accept_len is not None else (0, 1)
        if d.counters is not None:
            previous = d.counters
        out.append(Interval(d.batch_size, d.gen_tok_per_s, d.steady, d.accept_len, max(spec, 0), max(plain, 0)))
    return out


def level_accept_len(ivs: Sequence[Interval]) -> float | None:
    """The mean accept len over the intervals' speculative steps: their tokens per request per verify step.

    The mean, not the median: tokens grow linearly with acceptance, so at a given step cost the
    rate the traffic gets is the batch times the mean over its steps. Weighted by speculative
    steps, so a switch's interval with one probing step counts as one step. An interval whose
    speculative steps printed no accept len (one step counted before the overlap scheduler
    processed its result) adds nothing.
    """
    spec = [(iv.accept_len, iv.spec_steps) for iv in ivs if iv.accept_len is not None and iv.spec_steps > 0]
    steps = sum(n for _, n in spec)
    return sum(a * n for a, n in spec) / steps if steps else None


def at_accept_len(iv: Interval, accept_len: float | None) -> float | None:
    """The interval's rate had its speculative steps accepted accept_len tokens per request each.

    Its tokens are batch x (spec_steps x its accept len + plain_steps) in the interval's time; the
    same steps at accept_len give batch x (spec_steps x accept_len + plain_steps) in that time.
    """
    if iv.tok_per_s is None or accept_len is None or iv.accept_len is None or iv.spec_steps == 0:
        return iv.tok_per_s
    own = iv.spec_steps * iv.accept_len + iv.plain_steps
    return iv.tok_per_s * (iv.spec_steps * accept_len + iv.plain_steps) / own


def decode_rates_by_batch_size(text: str, rank: int = 0) -> dict[int, DecodeRates]:
    """Per batch size with a steady interval: the steady intervals' rates at the acceptance of every
    decode line at that batch size (the level's ramp-up and tail included, whose steps the
    traffic also ran).

    SGLang writes one decode line every few steps with the tokens per second since the previous
    line. Only intervals of decode steps at one batch size count (no prefill, no change of size):
    at bs = C they give the decode-step rate of a level of concurrency C without the client, the
    HTTP stack and the level's ramp-up and tail, which dominate the wall time of short levels on
    small models. A profile's wave after the levels is left out.
    """
    rl = parse_log(before_profile(text)).get(rank)
    by_bs: dict[int, list[Interval]] = {}
    for iv in intervals(rl.decode if rl else []):
        by_bs.setdefault(iv.batch_size, []).append(iv)
    out: dict[int, DecodeRates] = {}
    for bs, ivs in by_bs.items():
        accept_len = level_accept_len(ivs)
        rates = [at_accept_len(iv, accept_len) for iv in ivs if iv.steady]
        kept = tuple(r for r in rates if r is not None)
        if kept:
            out[bs] = DecodeRates(kept, accept_len)
    return out


def median_rate(rates: DecodeRates | None) -> float | None:
    return round(statistics.median(rates.rates), 1) if rates and rates.rates else None
