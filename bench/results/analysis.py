"""Where speculation stops paying, and the switch thresholds to use.

Concurrency in a closed-loop sweep is (at steady state) the decode batch size, so a crossover
concurrency c* translates into `--speculative-disable-batch-size N` with N = floor(c*): speculation
runs for batches of at most N requests. Hysteresis: speculation comes back on at M < N
(M = floor(0.75 N), at least 1), so a batch hovering around N does not flap.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Mapping, Sequence, TypeVar

from bench.results.recommendation import Recommendation

if TYPE_CHECKING:
    from bench.results.records import LevelRecord, RateKey

HYSTERESIS = 0.75


def switch_flags(disable: int, enable: int) -> str:
    return f"--speculative-disable-batch-size {disable} --speculative-enable-batch-size {enable}"


def hysteresis(disable: int) -> int:
    """The enable threshold for a disable threshold: below it, at least 1, at most `disable`."""
    if disable <= 0:
        return 0
    if disable == 1:
        return 1
    return max(1, min(disable - 1, math.floor(disable * HYSTERESIS)))


def _crossing(c0: float, r0: float, c1: float, r1: float) -> float:
    """Concurrency where the ratio crosses 1, interpolating log(ratio) linearly in log(concurrency)."""
    a, b = math.log(r0), math.log(r1)
    t = a / (a - b)
    return math.exp(math.log(c0) + t * (math.log(c1) - math.log(c0)))


def recommend(nospec: Mapping[int, float], spec: Mapping[int, float]) -> Recommendation:
    """Thresholds from two sweeps {concurrency: tok/s}; only levels present in both count."""
    levels = sorted(c for c in nospec if c in spec and c > 0 and nospec[c] > 0 and spec[c] > 0)
    if not levels:
        return Recommendation(
            "insufficient", None, None, None, "", "no concurrency level has throughput for both no-spec and always-spec"
        )
    ratios = {c: spec[c] / nospec[c] for c in levels}
    wins = [ratios[c] > 1.0 for c in levels]
    notes: list[str] = []
    lo, hi = levels[0], levels[-1]
    if not wins[0]:
        if any(wins):
            notes.append(
                "speculation wins at "
                + ", ".join(f"C={c} ({ratios[c]:.2f}x)" for c, w in zip(levels, wins, strict=False) if w)
                + " but not at the lowest level; not a usable low-load window"
            )
        msg = (
            f"speculation never pays: at C={lo} it gives {ratios[lo]:.2f}x of plain decoding "
            f"(worst {min(ratios.values()):.2f}x). Recommended: serve without speculation (drop "
            "--speculative-algorithm and its draft model). If speculation must stay configured, the "
            "closest switch setting (the flags below) speculates only for single-request decode batches "
            f"(disable above 1, back on at 1): the switch refuses thresholds below 1, so it cannot turn "
            f"speculation off for every batch, and a single request still runs at about {ratios[lo]:.2f}x "
            "of plain decoding" + (f" (measured at C={lo})" if lo == 1 else f" (C=1 not measured; C={lo} shown)") + "."
        )
        flags = switch_flags(1, 1)
        return Recommendation("never", None, 1, 1, flags, msg, ratios, notes)
    if all(wins):
        msg = (
            f"speculation wins at every measured level (C={lo}..{hi}, worst {min(ratios.values()):.2f}x): "
            f"keep it always on; no switch needed up to C={hi}. Measure higher concurrency to find a crossover."
        )
        return Recommendation("always", None, None, None, "", msg, ratios, notes)
    first_loss = wins.index(False)
    c0, c1 = levels[first_loss - 1], levels[first_loss]
    cross = _crossing(c0, ratios[c0], c1, ratios[c1])
    if any(wins[first_loss:]):
        notes.append(
            "speculation wins again at "
            + ", ".join(
                f"C={c} ({ratios[c]:.2f}x)" for c, w in zip(levels[first_loss:], wins[first_loss:], strict=False) if w
            )
            + ": noisy or non-monotonic sweep; the threshold uses the first crossing"
        )
    disable = max(1, math.floor(cross))
    enable = hysteresis(disable)
    msg = (
        f"speculation pays up to C~{cross:.1f} ({ratios[c0]:.2f}x at C={c0}, {ratios[c1]:.2f}x at C={c1}): "
        f"switch it off for decode batches larger than {disable}, back on at {enable} or fewer"
    )
    return Recommendation("crossover", cross, disable, enable, switch_flags(disable, enable), msg, ratios, notes)


# Where a ratio is taken: a closed-loop level (int) or an open-loop request rate (float).
Point = TypeVar("Point", int, float)


def best_of_ratios(
    switch: Mapping[Point, float], *refs: Mapping[Point, float], lower_is_better: bool = False
) -> dict[Point, float]:
    """switch / the best of refs per point (a level, a request rate) present in the switch's
    figures and at least one reference's: their highest, or their lowest where lower is better."""
    pick = min if lower_is_better else max
    out: dict[Point, float] = {}
    for c, v in switch.items():
        present = [r[c] for r in refs if c in r]
        best = pick(present) if present else 0.0
        if best > 0:
            out[c] = v / best
    return dict(sorted(out.items()))


def series(levels: Sequence[LevelRecord], key: RateKey = "tok_per_s") -> dict[int, float]:
    """{concurrency: rate} from a config's level records (errored ones and those without the rate left out)."""
    out: dict[int, float] = {}
    for lv in levels:
        rate = lv.rate(key)
        if not lv.errors and rate is not None and rate > 0:
            out[lv.concurrency] = float(rate)
    return out
