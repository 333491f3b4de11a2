"""Helpers shared by the switch's CPU tests: a v2 (overlap, topk 1) batch and its environment, and
the graph runner and forward batches the mode check sees. SGLang's own objects throughout."""

from __future__ import annotations

import types

import torch

from sglang_cpu import (
    make_pools,
    make_req,
    make_server_args,
    prefilled_decode_batch,
    use_torch_kernels,
    write_tiny_llama_config,
)

STEPS = 3
NUM_DRAFT_TOKENS = STEPS + 1  # topk 1: a chain of steps + 1 tokens
NUM_REQS = 6


def v2_env(tmp_path, monkeypatch, max_reqs=64, **server_args):
    """Pools and global server args for an overlap-scheduled topk-1 EAGLE-3 batch."""
    model_path = write_tiny_llama_config(tmp_path / "model")
    server_args = make_server_args(
        model_path,
        speculative_eagle_topk=1,
        speculative_num_steps=STEPS,
        speculative_num_draft_tokens=NUM_DRAFT_TOKENS,
        disable_overlap_schedule=False,
        **server_args,
    )
    use_torch_kernels(monkeypatch)
    return make_pools(server_args, max_reqs=max_reqs)


def handled_switch_args(tmp_path, **overrides):
    """ServerArgs of a tiny model with overrides, after the switch's own argument handling."""
    args = make_server_args(write_tiny_llama_config(tmp_path / "m"), **overrides)
    args._handle_speculative_switch()
    return args


def scheduler_metrics_collector_class():
    """SGLang's SchedulerMetricsCollector, wherever the tree's release keeps it."""
    try:
        from sglang.srt.metrics.collector import SchedulerMetricsCollector
    except ImportError:  # moved in v0.5.10
        from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector
    return SchedulerMetricsCollector


def v2_decode_batch(env, n=NUM_REQS):
    reqs = [make_req(f"r{i}", prompt_len=4 + i) for i in range(n)]
    batch = prefilled_decode_batch(env, reqs, [100 + i for i in range(n)], overlap=True, topk=1)
    return batch, reqs


def scheduler_for_output_processing():
    from sglang.srt.managers.scheduler import Scheduler

    scheduler = object.__new__(Scheduler)
    # The processor reads the stride from the draft worker's configuration.
    scheduler.draft_worker = types.SimpleNamespace(speculative_num_draft_tokens=NUM_DRAFT_TOKENS)
    return scheduler


def verify_graph_runner(max_bs: int):
    """A CudaGraphRunner as an EAGLE target builds it: TARGET_VERIFY, 16 tokens per request."""
    from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    runner = object.__new__(CudaGraphRunner)
    runner.require_mlp_tp_gather = False
    runner.require_mlp_sync = False
    runner.enable_pdmux = False
    runner.disable_padding = False
    runner.max_bs = max_bs
    runner.graphs = {}
    runner.is_encoder_decoder = False
    runner.enable_two_batch_overlap = False
    runner.capture_forward_mode = ForwardMode.TARGET_VERIFY
    runner.capture_hidden_mode = CaptureHiddenMode.FULL
    runner.num_tokens_per_bs = 16
    runner.model_runner = type("MR", (), {"spec_algorithm": SpeculativeAlgorithm.EAGLE3})()
    return runner


def forward_batch(mode, bs, tokens_per_req):
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch

    return ForwardBatch(
        forward_mode=mode,
        batch_size=bs,
        input_ids=torch.zeros(bs * tokens_per_req, dtype=torch.int64),
        req_pool_indices=torch.arange(bs),
        seq_lens=torch.full((bs,), 10),
        out_cache_loc=torch.zeros(bs * tokens_per_req, dtype=torch.int64),
        seq_lens_sum=10 * bs,
        capture_hidden_mode=CaptureHiddenMode.FULL,
    )
