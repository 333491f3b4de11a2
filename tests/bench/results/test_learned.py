"""A learning switch's thresholds beside the crossover of its references, on the run's first traffic
and on its second (--then-prompts: the -then records)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_helpers import decode_level  # noqa: E402

from bench.results import level_logs, report  # noqa: E402
from bench.results.records import ConfigRecord, RunResults  # noqa: E402

AUTO = ("--speculative-disable-batch-size", "auto")
SPEC = ("--speculative-algorithm", "EAGLE3")


def _crossover(nospec: tuple[float, float], spec: tuple[float, float]) -> float:
    """Where spec / nospec crosses 1 between C=10 and C=30, on a log scale as the analysis puts it."""
    lo, hi = math.log(spec[0] / nospec[0]), math.log(spec[1] / nospec[1])
    return 10 * 3 ** (lo / (lo - hi))


def test_the_second_traffic_is_compared_with_its_own_references() -> None:
    def cfg(flags: tuple[str, ...], decode: tuple[float, float], thresholds=(None, None), refs=()) -> ConfigRecord:
        levels = tuple(decode_level(c, d, d, t) for c, d, t in zip((10, 30), decode, thresholds, strict=True))
        return ConfigRecord(flags=flags, compare_to=refs, levels=levels)

    # speculation pays less on the second traffic: its crossover is lower
    run = RunResults(
        meta={},
        configs={
            "nospec": cfg((), (2000, 6000)),
            "nospec-then": cfg((), (2000, 6000)),
            "spec-v2": cfg(SPEC, (3000, 4500)),
            "spec-v2-then": cfg(SPEC, (2400, 4000)),
            "switch-v2-auto": cfg(AUTO, (3000, 6000), (24, 24), ("nospec", "spec-v2")),
            "switch-v2-auto-then": cfg(AUTO, (2400, 6000), (20, 15), ("nospec-then", "spec-v2-then")),
        },
    )
    analysis = report.analyse(run)
    text = report.markdown(run, analysis)
    first, then = _crossover((2000, 6000), (3000, 4500)), _crossover((2000, 6000), (2400, 4000))
    assert then < first
    assert (
        "- `switch-v2-auto` learned threshold at the end of each level: C=10: 24, C=30: 24; the run's crossover "
        f"of `spec-v2` and `nospec`: decode step C~{first:.1f}"
    ) in text
    assert (
        "- `switch-v2-auto-then` learned threshold at the end of each level: C=10: 20, C=30: 15; the run's "
        f"crossover of `spec-v2-then` and `nospec-then`: decode step C~{then:.1f}"
    ) in text
    assert analysis.ratios["switch-v2-auto-then"] == {10: 1.0, 30: 1.0}
    assert set(analysis.recommendations) == {"spec-v2"}, "the second traffic's speculation is not set against nospec"
    assert "- `switch-v2-auto-then`: `switch-v2-auto`'s server, after it, on the prompts of then_prompts" in text


def test_each_levels_threshold_is_shown_with_what_it_was_learnt_from() -> None:
    """GPU 24 (docs/bench/h100-auto-then): on the first traffic the threshold at C=30 and above
    was 33, learnt with buckets 1-10 timed in both modes (its last change, `34 -> 33`, logged
    `... 10: 2850/1623 (2.74); surely pays up to 33`, read by hand): the basis each level's line
    now carries, so that a threshold far from the run's crossover shows it was never timed there."""
    import tarfile

    from bench.results.records import LevelRecord, read_results

    run_dir = Path(__file__).resolve().parents[3] / "docs" / "bench" / "h100-auto-then"
    run, _ = read_results(run_dir / "results.json")
    with tarfile.open(run_dir / "logs.tar.xz") as tar:
        member = tar.extractfile("logs/switch-v2-auto.log")
        assert member is not None
        log = member.read().decode(errors="replace")
    first = run.configs["switch-v2-auto"]
    # the first traffic's part of the log: its levels' flushes (the second traffic's follow)
    flushes = log.split("Cache flushed successfully")
    first_part = "Cache flushed successfully".join(flushes[: len(first.levels) + 1])
    config = level_logs.with_decode_rates(first, first_part)
    by_level = {lv.concurrency: (lv.switch_threshold, lv.switch_timed, lv.switch_sure) for lv in config.levels}
    assert by_level[1] == by_level[2] == (8, None, None), "the prior: no change logged yet"
    assert by_level[5] == (10, (1, 2, 5), 8)  # `8 -> 10`, logged in C=5's part
    assert by_level[30] == by_level[250] == (33, (1, 2, 5, 10), 33)
    assert all(LevelRecord.from_json(lv.to_json(), "level") == lv for lv in config.levels)
    run.configs = {"switch-v2-auto": config}
    text = report.markdown(run, report.analyse(run))
    assert "C=30: 33 (timed both ways at 1, 2, 5, 10; sure up to 33)" in text
