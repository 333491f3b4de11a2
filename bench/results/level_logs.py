"""What a config's server log says about each of its levels, once the server has stopped: the steady
decode rate at the level's batch size (bench.results.decode_rate), the prefill batches
(bench.results.boundaries) and what a learning switch's threshold was learnt from
(bench.results.learned)."""

from __future__ import annotations

import dataclasses

from bench.results.boundaries import level_parts_if_cut, prefill_batch_count
from bench.results.decode_rate import decode_rates_by_batch_size, median_rate
from bench.results.learned import basis_by_level
from bench.results.logparse import ThresholdChange
from bench.results.records import ConfigRecord, LevelRecord


def with_decode_rates(config: ConfigRecord, log_text: str) -> ConfigRecord:
    """The config, each level given the median of the server's steady decode throughput at bs = its
    concurrency, speculative steps counted at the acceptance of all its decode lines at that bs,
    and the prefill batches its part of the log holds."""
    by_bs = decode_rates_by_batch_size(log_text)
    parts = level_parts_if_cut(log_text, len(config.levels))
    prefills: list[int | None] = [None] * len(config.levels)
    bases: list[ThresholdChange | None] = [None] * len(config.levels)
    if parts is not None:
        prefills = [prefill_batch_count(part) for part in parts]
        bases = basis_by_level(log_text, parts)

    def level(lv: LevelRecord, prefill_batches: int | None, basis: ThresholdChange | None) -> LevelRecord:
        rates = by_bs.get(lv.concurrency)
        accept_len = rates.accept_len if rates else None
        return dataclasses.replace(
            lv,
            decode_lines=len(rates.rates) if rates else 0,
            decode_tok_per_s=median_rate(rates),
            decode_accept_len=None if accept_len is None else round(accept_len, 3),
            prefill_batches=prefill_batches,
            switch_timed=basis.timed if basis else None,
            switch_sure=basis.sure if basis else None,
        )

    return dataclasses.replace(config, levels=tuple(map(level, config.levels, prefills, bases)))
