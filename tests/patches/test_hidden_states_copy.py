"""The overlap scheduler copies a step's hidden states to the host only for a batch that returns
them (0016).

Scheduler.run_batch's overlap branch on 0.5.9's own objects on CPU: a real prefill batch, the real
FutureMap, the result's copy to the host. The worker is stood in for by what the v2 EAGLE worker's
prefill returns: the target's hidden states captured for every prompt token (CaptureHiddenMode.FULL,
for the draft's extend), which here live on the meta device, so that a copy to the host shows as
the error that copying out of a meta tensor raises.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from sglang_cpu import HIDDEN, VOCAB, make_req, prefill_batch
from switch_helpers import v2_env


@pytest.fixture
def env(tmp_path, monkeypatch):
    return v2_env(tmp_path, monkeypatch)


class PrefillingWorker:
    """What EAGLEWorkerV2.forward_batch_generation returns for a prefill of bs requests."""

    def forward_batch_generation(self, mwb):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        bs, tokens = len(mwb.seq_lens), int(sum(mwb.extend_seq_lens))
        captured = torch.empty(tokens, 3 * HIDDEN, device="meta")  # EAGLE-3: three target layers
        sampled = torch.arange(bs, dtype=torch.int64) + 100
        draft = EagleDraftInput(
            hidden_states=torch.zeros(bs, HIDDEN),
            verified_id=sampled.to(torch.int32),
            topk_p=torch.ones(bs, 1),
            topk_index=torch.ones(bs, 1, dtype=torch.int64),
            new_seq_lens=mwb.seq_lens.clone(),
        )
        return GenerationBatchResult(
            logits_output=LogitsProcessorOutput(next_token_logits=torch.zeros(bs, VOCAB), hidden_states=captured),
            next_token_ids=sampled,
            next_draft_input=draft,
            can_run_cuda_graph=False,
        )


def _overlap_scheduler(env):
    """A Scheduler with what run_batch's overlap branch reads, its streams the CPU's."""
    from sglang.srt.managers.overlap_utils import FutureMap
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.server_args import get_global_server_args
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    scheduler = object.__new__(Scheduler)
    scheduler.server_args = get_global_server_args()
    scheduler.forward_ct, scheduler.forward_sleep_time = 0, None
    scheduler._profile_batch_predicate = lambda batch: None  # the profiler is off
    scheduler.is_generation, scheduler.enable_overlap, scheduler.enable_pdmux = True, True, False
    scheduler.spec_algorithm = SpeculativeAlgorithm.EAGLE3
    scheduler.batch_record_ct, scheduler.batch_record_buf = 0, [None, None]
    scheduler.future_map = FutureMap(8, 8192, 1024, torch.device("cpu"), SpeculativeAlgorithm.EAGLE3)
    scheduler.device_module = torch.get_device_module("cpu")
    # 0.5.10 renamed the scheduler's own stream default_stream -> schedule_stream
    cpu_stream = scheduler.device_module.current_stream()
    scheduler.default_stream = scheduler.schedule_stream = scheduler.forward_stream = cpu_stream
    scheduler.forward_stream_ctx = contextlib.nullcontext()
    scheduler.enable_metrics = False
    scheduler.model_worker = PrefillingWorker()
    return scheduler


def _prefill(env, return_hidden_states):
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    reqs = [make_req(f"r{i}", 6 + i) for i in range(3)]
    for req in reqs:
        req.return_hidden_states = return_hidden_states
    batch = prefill_batch(env, reqs, overlap=True)
    batch.sampling_info = SamplingBatchInfo.from_schedule_batch(batch, VOCAB)
    return batch


def test_a_prefill_leaves_the_draft_s_hidden_states_on_the_device(env):
    result = _overlap_scheduler(env).run_batch(_prefill(env, return_hidden_states=False))

    assert result.logits_output.hidden_states.is_meta, "copied to the host though no request returns them"
    assert result.next_token_ids.tolist() == [100, 101, 102]  # the rest of the result still comes over


def test_a_request_that_returns_hidden_states_still_gets_them(env):
    with pytest.raises(NotImplementedError, match="meta"):  # the copy to the host was made
        _overlap_scheduler(env).run_batch(_prefill(env, return_hidden_states=True))
