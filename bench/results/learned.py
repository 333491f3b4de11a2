"""What a learning switch (`--speculative-disable-batch-size auto`) settled on, beside the crossover
the run measured between its references.

The switch learns from its own step costs, so the crossover to compare it with is the decode-step
one (each level's steady decode rate, no prefill in the interval, speculative steps at the level's
acceptance: bench.results.decode_rate); the output-rate crossover, which also holds each wave's
start, is shown beside it.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.configs import BASELINE_NOSPEC, declared_references, first_traffic_name, then_name
from bench.results.analysis import Recommendation, recommend, series
from bench.results.boundaries import FLUSHED
from bench.results.logparse import ThresholdChange, threshold_changes
from bench.results.records import ConfigRecord, LevelRecord, RateKey, RunResults


def learned_lines(run: RunResults) -> list[str]:
    """One line per config whose levels recorded a learned threshold."""
    out = []
    for name, cfg in run.configs.items():
        learned = [lv for lv in cfg.levels if lv.switch_threshold is not None]
        if not learned:
            continue
        cells = ", ".join(f"C={lv.concurrency}: {lv.switch_threshold}{_basis(lv)}" for lv in learned)
        out.append(f"- `{name}` learned threshold at the end of each level: {cells}; " + _crossovers(run, name, cfg))
    return out + [""] if out else []


def _basis(lv: LevelRecord) -> str:
    if lv.switch_timed is None:
        return ""
    timed = ", ".join(map(str, lv.switch_timed)) or "none"
    return f" (timed both ways at {timed}; sure up to {lv.switch_sure})"


def basis_by_level(log_text: str, parts: Sequence[str]) -> list[ThresholdChange | None]:
    """For each level's part of the log (boundaries.level_parts), the last threshold change logged
    before the level's end, the warm-up's and earlier levels' included."""
    out: list[ThresholdChange | None] = []
    last = next(reversed(threshold_changes(log_text.split(FLUSHED, 1)[0])), None)  # the warm-up's
    for part in parts:
        last = next(reversed(threshold_changes(part)), last)
        out.append(last)
    return out


def _crossovers(run: RunResults, name: str, cfg: ConfigRecord) -> str:
    # a second traffic's record (-then) against its references' records on that traffic
    nospec_name = then_name(BASELINE_NOSPEC) if first_traffic_name(name) else BASELINE_NOSPEC
    nospec = run.configs.get(nospec_name)
    spec = next((r for r in declared_references(name, cfg.compare_to) if r != nospec_name), None)
    if nospec is None or spec is None or spec not in run.configs:
        return "no nospec and always-speculating reference in this run to compare with."
    keys: tuple[tuple[str, RateKey], ...] = (("decode step", "decode_tok_per_s"), ("output", "tok_per_s"))
    found = [
        f"{label} {_crossover_text(recommend(series(nospec.levels, key), series(run.configs[spec].levels, key)))}"
        for label, key in keys
    ]
    return f"the run's crossover of `{spec}` and `{nospec_name}`: " + ", ".join(found) + "."


def _crossover_text(rec: Recommendation) -> str:
    if rec.kind == "crossover" and rec.crossover is not None:
        return f"C~{rec.crossover:.1f}"
    return {
        "always": "none (speculation wins at every level)",
        "never": "below the lowest level",
        "insufficient": "not measured",
    }.get(rec.kind, rec.kind)
