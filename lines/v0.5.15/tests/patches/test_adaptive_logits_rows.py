"""0003: the shared logits buffer holds the graphs of every adaptive runtime state, not only the
active one's (CPU).

On 0.5.15 a server with --speculative-adaptive and upstream's default tiers (candidate steps up to
7) died at start-up capturing the steps=7 state's draft-extend graphs: "shared logits buffer holds
1024 rows but caller needs 2048" (H200, 256 decode graph sizes, 3 steps active). The buffer is sized
by ModelRunner.max_decode_logits_rows on the real ModelRunner method here; a state's runners ask it
for rows = their largest captured batch x their tokens a request, as the draft-extend runner
(eagle_draft_extend_cuda_graph_runner.py) and the target's verify runner do.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sglang_cpu import VOCAB, init_single_rank_groups, make_pools, make_server_args, write_tiny_llama_config

CAPTURE_BS = [1, 2, 4, 8, *range(16, 257, 8)]  # SGLang's default decode graph sizes up to 256


@pytest.fixture
def fresh_shared_output(monkeypatch):
    from sglang.srt.model_executor.graph_shared_output import GraphSharedOutput

    # the buffer is cached per process: each case sizes its own
    monkeypatch.setattr(GraphSharedOutput, "_process_shared", None)
    return GraphSharedOutput


def _runner(tmp_path: Path, *, draft: bool = False, **server_overrides):
    from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    init_single_rank_groups()
    model_path = write_tiny_llama_config(tmp_path / "model")
    graphs = CudaGraphConfig.from_dict({"decode": {"bs": CAPTURE_BS, "max_bs": CAPTURE_BS[-1]}})
    server_args = make_server_args(model_path, cuda_graph_config=graphs, **server_overrides)
    runner = object.__new__(ModelRunner)  # no model, no GPU: what max_decode_logits_rows reads
    runner.device, runner.server_args, runner.is_draft_worker = "cpu", server_args, draft
    runner.spec_algorithm = SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)
    runner.req_to_token_pool = make_pools(server_args, max_reqs=CAPTURE_BS[-1]).req_to_token_pool
    return runner


def _rows_each_state_asks(runner, candidate_steps: list[int]) -> dict[int, int]:
    """Per candidate step count (topk 1: steps + 1 tokens a request), the most rows its runners ask."""
    from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture

    rows = {}
    for steps in candidate_steps:
        width = steps + 1
        draft_extend = max(get_batch_sizes_to_capture(runner)[0]) * width
        verify = max(get_batch_sizes_to_capture(runner, width)[0]) * width
        rows[steps] = max(draft_extend, verify)
    return rows


@pytest.mark.parametrize("draft", [False, True], ids=["target", "draft"])
def test_upstreams_default_tiers_fit_the_buffer(tmp_path, fresh_shared_output, draft):
    from sglang.srt.speculative.adaptive_spec_params import resolve_candidate_steps_from_config

    runner = _runner(tmp_path, draft=draft, speculative_adaptive=True, speculative_adaptive_config=None)
    candidates = resolve_candidate_steps_from_config(cfg_path=None)
    assert max(candidates) > runner.server_args.speculative_num_steps  # the case that crashed
    shared = fresh_shared_output.create_for_model_runner(runner)
    for steps, rows in _rows_each_state_asks(runner, candidates).items():
        buffer = shared.get_logits_buffer(VOCAB, rows=rows)  # raised for steps=7 before 0003
        assert buffer.shape == (rows, VOCAB), steps


def test_a_tier_file_within_the_active_steps_keeps_the_buffer_as_it_was(tmp_path, fresh_shared_output):
    tiers = tmp_path / "tiers.json"
    tiers.write_text(json.dumps({"1": {"candidate_steps": [3]}, "12": {"candidate_steps": [0]}}))
    runner = _runner(tmp_path, speculative_adaptive=True, speculative_adaptive_config=str(tiers))
    active = _rows_each_state_asks(runner, [runner.server_args.speculative_num_steps])
    # no larger than the active width needs: the tier file `make bench` writes costs no memory
    assert runner.max_decode_logits_rows() == max(active.values()) == CAPTURE_BS[-1] * 4


def test_without_adaptive_speculation_the_size_is_the_active_widths(tmp_path, fresh_shared_output):
    runner = _runner(tmp_path)
    assert runner.max_decode_logits_rows() == CAPTURE_BS[-1] * runner.server_args.speculative_num_draft_tokens
    plain = _runner(tmp_path / "plain", speculative_algorithm=None)
    assert plain.max_decode_logits_rows() == CAPTURE_BS[-1]
    assert (
        torch.Size([CAPTURE_BS[-1], VOCAB])
        == fresh_shared_output.create_for_model_runner(plain).get_logits_buffer(VOCAB, rows=CAPTURE_BS[-1]).shape
    )
