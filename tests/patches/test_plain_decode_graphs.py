"""Graph selection for speculation-off steps: DECODE batches replay DECODE graphs only.

The runner objects are SGLang's own; only `replay`, which launches a captured CUDA graph, is
recorded instead of run.
"""

from __future__ import annotations

import pytest

from sglang_cpu import init_single_rank_groups, make_server_args, write_tiny_llama_config
from switch_helpers import forward_batch, verify_graph_runner


def _plain_decode_graph_runner(max_bs):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    runner = verify_graph_runner(max_bs)
    runner.capture_forward_mode = ForwardMode.DECODE
    runner.num_tokens_per_bs = 1
    runner.plain_decode = True
    return runner


def _model_runner(verify, decode):
    from sglang.srt.model_executor.model_runner import ModelRunner

    model_runner = object.__new__(ModelRunner)
    model_runner.device = "cuda"
    model_runner.graph_runner = verify
    model_runner.decode_graph_runner = decode
    return model_runner


def _recording(runner, name, calls):
    def replay(forward_batch, **kwargs):
        calls.append((name, forward_batch.forward_mode.name, forward_batch.batch_size))
        return "logits"

    runner.replay = replay
    return runner


def test_each_mode_replays_its_own_graph_set(tmp_path):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    make_server_args(write_tiny_llama_config(tmp_path / "m"))
    calls = []
    verify = _recording(verify_graph_runner(max_bs=8), "verify", calls)
    decode = _recording(_plain_decode_graph_runner(max_bs=64), "decode", calls)
    model_runner = _model_runner(verify, decode)

    out = model_runner._forward_raw(forward_batch(ForwardMode.DECODE, 40, 1), False, None)
    assert out.can_run_graph and out.logits_output == "logits"
    model_runner._forward_raw(forward_batch(ForwardMode.TARGET_VERIFY, 4, 16), False, None)

    assert calls == [("decode", "DECODE", 40), ("verify", "TARGET_VERIFY", 4)]


def test_without_plain_decode_graphs_a_decode_batch_does_not_replay_verify(tmp_path):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    make_server_args(write_tiny_llama_config(tmp_path / "m"))
    calls = []
    verify = _recording(verify_graph_runner(max_bs=64), "verify", calls)
    model_runner = _model_runner(verify, None)

    with pytest.raises(AttributeError):
        # Eager path: needs the model (GPU), which this runner has not; reaching it is the point.
        model_runner._forward_raw(forward_batch(ForwardMode.DECODE, 10, 1), False, None)
    assert calls == []


def _capture_sizes(tmp_path, speculating_only, **switch):
    from types import SimpleNamespace

    from sglang.srt.model_executor.cuda_graph_runner import get_batch_sizes_to_capture

    init_single_rank_groups()
    args = make_server_args(
        write_tiny_llama_config(tmp_path / "m"),
        cuda_graph_bs=[1, 2, 4, 8, 12, 16, 24, 32, 48, 64],
        **switch,
    )
    model_runner = SimpleNamespace(server_args=args, req_to_token_pool=SimpleNamespace(size=256))
    capture_bs, _ = get_batch_sizes_to_capture(model_runner, 16, speculating_only=speculating_only)
    return capture_bs


@pytest.mark.parametrize(
    "disable, expected",
    [(5, [1, 2, 4, 8]), (8, [1, 2, 4, 8]), (100, [1, 2, 4, 8, 12, 16, 24, 32, 48, 64])],
)
def test_speculating_graphs_stop_at_the_size_the_threshold_pads_to(tmp_path, disable, expected):
    """Speculative steps run at bs <= N only; larger verify/draft graphs would never replay."""
    switch = dict(speculative_disable_batch_size=disable, speculative_enable_batch_size=3)
    assert _capture_sizes(tmp_path, True, **switch) == expected
    # The draft-extend graphs also serve the fallback's draft sync: all sizes.
    assert _capture_sizes(tmp_path, False, **switch)[-1] == 64


def test_without_the_switch_speculating_graphs_keep_every_size(tmp_path):
    assert _capture_sizes(tmp_path, True)[-1] == 64
