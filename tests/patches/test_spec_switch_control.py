"""The speculation switch's decision, its server arguments, the graph-runner guard, and metrics.

All of it is the patched SGLang code itself, run on CPU.
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from sglang_cpu import make_server_args, write_tiny_llama_config
from switch_helpers import (
    forward_batch,
    handled_switch_args,
    scheduler_metrics_collector_class,
    v2_decode_batch,
    v2_env,
    verify_graph_runner,
)


def test_hysteresis_switches_once_per_crossing():
    from sglang.srt.speculative.spec_switch import SpecSwitch, StepKind

    switch = SpecSwitch(disable_batch_size=8, enable_batch_size=4)
    ramp = [1, 8, 9, 8, 7, 5, 9, 4, 5, 8, 9, 6]
    decisions = [switch.decide(bs) is StepKind.SPECULATIVE for bs in ramp]

    assert decisions == [True, True, False, False, False, False, False, True, True, True, False, False]
    assert switch.switches == 3
    assert switch.spec_steps == decisions.count(True)
    assert switch.fallback_steps == decisions.count(False)
    assert switch.status() == ("spec-switch: on=False spec_steps=5 fallback_steps=7 switches=3")


def test_equal_thresholds_follow_the_batch_size_exactly():
    from sglang.srt.speculative.spec_switch import SpecSwitch, StepKind

    switch = SpecSwitch(disable_batch_size=4, enable_batch_size=4)
    kinds = [switch.decide(bs) for bs in [4, 5, 4, 5]]
    assert kinds == [StepKind.SPECULATIVE, StepKind.FALLBACK] * 2


def test_switch_is_off_unless_configured(tmp_path):
    from sglang.srt.speculative.spec_switch import SpecSwitch

    args = make_server_args(write_tiny_llama_config(tmp_path / "m"))
    assert SpecSwitch.from_server_args(args) is None


def test_enable_batch_size_defaults_below_the_disable_threshold(tmp_path):
    assert handled_switch_args(tmp_path, speculative_disable_batch_size=32).speculative_enable_batch_size == 24
    assert handled_switch_args(tmp_path, speculative_disable_batch_size=1).speculative_enable_batch_size == 1


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"speculative_enable_batch_size": 4}, "needs --speculative-disable-batch-size"),
        ({"speculative_disable_batch_size": 0}, "must be at least 1, got 0"),
        (
            {"speculative_disable_batch_size": 8, "speculative_enable_batch_size": 9},
            r"\(9\) must be between 1 and --speculative-disable-batch-size \(8\)",
        ),
        ({"speculative_disable_batch_size": 8, "pp_size": 2}, "pipeline parallelism"),
        (
            {"speculative_disable_batch_size": 8, "enable_multi_layer_eagle": True},
            "does not support --enable-multi-layer-eagle",
        ),
        (
            {"speculative_disable_batch_size": 8, "speculative_algorithm": "NGRAM"},
            "EAGLE or EAGLE3, not NGRAM",
        ),
    ],
)
def test_bad_switch_arguments_are_refused(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        handled_switch_args(tmp_path, **overrides)


def test_dp_attention_on_the_v2_worker_is_refused(tmp_path, monkeypatch):
    """The core refuses DP attention for both workers; the DP-attention patch (0015) lifts that for
    v1 only, so on v2 the refusal holds on every prefix of the series."""
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "1")
    with pytest.raises(ValueError, match="--enable-dp-attention"):
        handled_switch_args(tmp_path, speculative_disable_batch_size=8, enable_dp_attention=True)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({}, 48),  # upstream: a speculative server runs at most 48 requests unless told
        ({"speculative_disable_batch_size": 8}, 256),  # the largest CUDA graph
        ({"speculative_disable_batch_size": 8, "cuda_graph_max_bs": 16}, 48),  # never below upstream's
        ({"speculative_disable_batch_size": 8, "max_running_requests": 100}, 100),
        ({"max_running_requests": 100}, 100),
    ],
)
def test_switch_lifts_the_speculative_running_request_cap(tmp_path, overrides, expected):
    """Above the threshold the switch decodes like a plain server; a cap of 48 running
    requests would keep it from ever batching like one."""
    model = write_tiny_llama_config(tmp_path / "m")
    args = make_server_args(model, speculative_draft_model_path=str(model), **{"cuda_graph_max_bs": 256, **overrides})
    args._handle_speculative_decoding()
    args._handle_speculative_switch()
    assert args.max_running_requests == expected


def test_switch_arguments_are_in_help():
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(
        [
            "--model-path",
            "m",
            "--speculative-disable-batch-size",
            "16",
            "--speculative-enable-batch-size",
            "8",
        ]
    )
    assert (args.speculative_disable_batch_size, args.speculative_enable_batch_size) == (16, 8)
    assert "--speculative-disable-batch-size" in parser.format_help()


def test_decode_batch_never_replays_a_verify_graph():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    runner = verify_graph_runner(max_bs=32)
    assert runner.can_run(forward_batch(ForwardMode.TARGET_VERIFY, 10, 16))
    assert not runner.can_run(forward_batch(ForwardMode.DECODE, 10, 1))
    assert runner.can_run(forward_batch(ForwardMode.IDLE, 0, 1))


def test_fallback_steps_do_not_dilute_acceptance_metrics(tmp_path):
    """The scheduler's per-interval acceptance counts only speculative steps."""
    from sglang.srt.managers.scheduler import Scheduler

    make_server_args(write_tiny_llama_config(tmp_path / "m"))
    scheduler = object.__new__(Scheduler)
    scheduler.spec_num_accepted_tokens = 0
    scheduler.spec_num_forward_ct = 0
    scheduler.num_generated_tokens = 0
    # 4 requests, 2 speculative steps accepting 3 drafts each, then 5 fallback steps.
    for _ in range(2):
        scheduler.update_spec_metrics(4, 12)
    accept_length = scheduler.spec_num_accepted_tokens / scheduler.spec_num_forward_ct
    assert accept_length == 4.0
    # The processor calls update_spec_metrics only when the result was speculative.
    from sglang.srt.managers.utils import GenerationBatchResult

    fallback = GenerationBatchResult(next_token_ids=torch.zeros(4), spec_skipped=True)
    assert fallback.spec_skipped and not GenerationBatchResult().spec_skipped


def test_prometheus_counters_follow_the_switch():
    from prometheus_client import CollectorRegistry  # noqa: F401  (the real client)

    SchedulerMetricsCollector = scheduler_metrics_collector_class()
    from sglang.srt.speculative.spec_switch import SpecSwitch

    collector = object.__new__(SchedulerMetricsCollector)
    from prometheus_client import Counter

    registry = CollectorRegistry()
    labels = {"model_name": "m"}
    collector.labels = labels
    for name in ("spec_steps", "fallback_steps", "switches"):
        setattr(
            collector,
            f"spec_switch_{name}_total",
            Counter(f"sglang:spec_switch_{name}_total", name, labels.keys(), registry=registry),
        )
    collector.last_spec_switch_counts = (0, 0, 0)

    switch = SpecSwitch(8, 4)
    for bs in [1, 9, 9, 2]:
        switch.decide(bs)
    collector.log_spec_switch(switch)
    switch.decide(9)
    collector.log_spec_switch(switch)

    value = lambda n: registry.get_sample_value(f"sglang:spec_switch_{n}_total", labels)  # noqa: E731
    assert (value("spec_steps"), value("fallback_steps"), value("switches")) == (2.0, 3.0, 3.0)


def test_prometheus_counters_count_every_decode_step(tmp_path, monkeypatch):
    """The counters move with the per-iteration hook every decode step runs, not only at the
    decode log line (every --decode-log-interval steps), so /metrics holds a level's last steps."""
    from prometheus_client import REGISTRY
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.server_args import get_global_server_args
    from sglang.srt.speculative.spec_switch import SpecSwitch

    SchedulerMetricsCollector = scheduler_metrics_collector_class()

    batch, _ = v2_decode_batch(v2_env(tmp_path, monkeypatch))
    labels = {"model_name": "every-step", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
    scheduler = object.__new__(Scheduler)
    scheduler.enable_metrics = True
    scheduler.metrics_collector = SchedulerMetricsCollector(labels=labels, server_args=get_global_server_args())
    scheduler.scheduler_status_logger = None
    switch = SpecSwitch(disable_batch_size=4, enable_batch_size=2)
    scheduler.draft_worker = types.SimpleNamespace(spec_switch=switch)

    counted = []
    for bs in [1, 6, 6, 6, 1]:
        switch.decide(bs)
        scheduler.log_decode_stats_every_iteration(batch, num_accepted_tokens=0)
        counted.append(
            tuple(
                REGISTRY.get_sample_value(f"sglang:spec_switch_{n}_total", labels)
                for n in ("spec_steps", "fallback_steps", "switches")
            )
        )
    assert counted == [(1, 0, 0), (1, 1, 1), (1, 2, 1), (1, 3, 1), (2, 3, 2)]


def _batch_output(**fields):
    """A real BatchStrOutput with every other field empty."""
    from sglang.srt.managers.io_struct import BatchStrOutput

    values = {f.name: None for f in dataclasses.fields(BatchStrOutput)}
    values.update(fields)
    return BatchStrOutput(**values)


@pytest.mark.parametrize(
    "disable_batch_size, expected",
    [(None, 131 / 10), (8, 1 + 20 / 10)],
)
def test_per_request_accept_length_leaves_out_fallback_tokens(tmp_path, disable_batch_size, expected):
    """10 verify steps accepted 20 draft tokens; 100 more tokens came from fallback steps."""
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    manager = object.__new__(TokenizerManager)
    manager.server_args = make_server_args(
        write_tiny_llama_config(tmp_path / "m"),
        speculative_disable_batch_size=disable_batch_size,
    )
    recv = _batch_output(
        completion_tokens=[1 + 10 + 20 + 100],
        spec_verify_ct=[10],
        spec_accepted_tokens=[20],
        spec_acceptance_histogram=[],
    )
    meta_info = {}
    manager._calculate_spec_decoding_metrics(meta_info, recv, 0)
    assert meta_info["spec_accept_length"] == pytest.approx(expected)
    assert meta_info["spec_accept_rate"] == pytest.approx(20 / (10 * 15))
