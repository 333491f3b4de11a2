"""Triton's DRAFT_EXTEND_V2 graph replay must attend as its eager path does (0006).

SGLang's own TritonAttnBackend metadata code on CPU; only the triton kernel that gathers KV indices
is stood in for by a torch reference.
"""

from __future__ import annotations

import types

import pytest
import torch

from sglang_cpu import Launcher, make_server_args, write_tiny_llama_config

NUM_DRAFT_TOKENS = 4  # v2 runs topk 1: steps + 1 rows per request
MAX_BS = 8


def _create_kv_indices(req_to_token, req_pool_indices, kv_lens, kv_indptr, kv_start, kv_indices, _stride):
    # Request i's first kv_lens[i] slots of req_to_token, at kv_indptr[i].
    assert kv_start is None
    for i in range(req_pool_indices.numel()):
        n, at = int(kv_lens[i]), int(kv_indptr[i])
        kv_indices[at : at + n] = req_to_token[req_pool_indices[i], :n]


@pytest.fixture
def backend(tmp_path, monkeypatch):
    from sglang.srt.layers.attention import triton_backend

    make_server_args(write_tiny_llama_config(tmp_path / "m"))
    monkeypatch.setattr(triton_backend, "create_flashinfer_kv_indices_triton", Launcher(_create_kv_indices))
    b = object.__new__(triton_backend.TritonAttnBackend)
    b.device = "cpu"
    b.speculative_num_steps = NUM_DRAFT_TOKENS - 1
    b.num_draft_tokens = NUM_DRAFT_TOKENS
    b.sliding_window_size = None
    b.window_kv_indptr = torch.zeros(MAX_BS + 1, dtype=torch.int32)
    b.kv_indptr = torch.zeros(MAX_BS + 1, dtype=torch.int32)
    b.qo_indptr = torch.zeros(MAX_BS + 1, dtype=torch.int32)
    b.cuda_graph_kv_indices = torch.full((4096,), -1, dtype=torch.int64)
    # Distinct slot numbers, so a KV index names its request and position.
    b.req_to_token = torch.arange(16 * 256, dtype=torch.int32).reshape(16, 256)
    return b


def _draft_extend_v2(prefix_lens, accept_lens, req_pool_indices):
    """What prepare_for_extend_to_fill_draft_kvcache hands the draft: NUM_DRAFT_TOKENS rows per
    request and seq_lens that already count them, whatever each request accepted."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    bs = len(prefix_lens)
    prefix = torch.tensor(prefix_lens, dtype=torch.int32)
    return types.SimpleNamespace(
        batch_size=bs,
        forward_mode=ForwardMode.DRAFT_EXTEND_V2,
        spec_info=types.SimpleNamespace(accept_length=torch.tensor(accept_lens, dtype=torch.int32)),
        req_pool_indices=torch.tensor(req_pool_indices, dtype=torch.int64),
        seq_lens=prefix + NUM_DRAFT_TOKENS,
        extend_prefix_lens=prefix,
        extend_prefix_lens_cpu=list(prefix_lens),
        extend_seq_lens=torch.full((bs,), NUM_DRAFT_TOKENS, dtype=torch.int32),
        extend_seq_lens_cpu=[NUM_DRAFT_TOKENS] * bs,
    )


def _eager(backend, fb):
    backend.init_forward_metadata(fb)
    m = backend.forward_metadata
    # The eager path writes into the same indptr buffers the replay uses: keep copies.
    return m.qo_indptr.clone(), m.kv_indptr.clone(), m.kv_indices.clone()


def _replay(backend, fb, captured_bs, fill_seq_len=1):
    raw_bs = fb.batch_size
    pad = captured_bs - raw_bs
    # As the draft-extend graph runner pads a batch up to a captured size.
    seq_lens = torch.cat([fb.seq_lens, torch.full((pad,), fill_seq_len, dtype=fb.seq_lens.dtype)])
    req_pool_indices = torch.cat([fb.req_pool_indices, torch.zeros(pad, dtype=torch.int64)])
    accept = torch.cat([fb.spec_info.accept_length, torch.full((pad,), NUM_DRAFT_TOKENS, dtype=torch.int32)])
    backend.init_forward_metadata_replay_cuda_graph(
        bs=captured_bs,
        req_pool_indices=req_pool_indices,
        seq_lens=seq_lens,
        seq_lens_sum=int(seq_lens.sum()),
        encoder_lens=None,
        forward_mode=fb.forward_mode,
        spec_info=types.SimpleNamespace(accept_length=accept),
        seq_lens_cpu=seq_lens.clone(),
    )
    return backend.qo_indptr[: captured_bs + 1].clone(), backend.kv_indptr[: captured_bs + 1].clone()


@pytest.mark.parametrize("accept_lens", [[1, 1, 1], [1, 3, 2], [4, 4, 4]])
def test_replay_takes_the_rows_and_prefix_the_eager_extend_takes(backend, accept_lens):
    fb = _draft_extend_v2([5, 9, 7], accept_lens, [2, 0, 5])
    eager_qo, eager_kv_indptr, eager_kv_indices = _eager(backend, fb)

    qo, kv_indptr = _replay(backend, fb, captured_bs=3)

    # Queries: every request's NUM_DRAFT_TOKENS rows, at the stride the runner lays them out in,
    # whatever it accepted (a fallback step's draft sync accepts 1).
    assert qo.tolist() == eager_qo.tolist() == [0, 4, 8, 12]
    # Cached KV: the prefix only; the extend kernel takes the rows being written as its own input.
    assert kv_indptr.tolist() == eager_kv_indptr.tolist() == [0, 5, 14, 21]
    assert backend.cuda_graph_kv_indices[:21].tolist() == eager_kv_indices.tolist()


def test_padded_requests_attend_to_nothing_cached(backend):
    fb = _draft_extend_v2([5, 9, 7], [1, 3, 2], [2, 0, 5])
    qo, kv_indptr = _replay(backend, fb, captured_bs=4)

    assert qo.tolist() == [0, 4, 8, 12, 16]
    assert kv_indptr.tolist() == [0, 5, 14, 21, 21]


def test_v1_draft_extend_replay_keeps_its_compacted_rows(backend):
    # v1 packs accept_length rows per request (prepare_extend_after_decode); its replay layout is
    # SGLang's own and stays as it was.
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    fb = _draft_extend_v2([5, 9, 7], [1, 3, 2], [2, 0, 5])
    fb.forward_mode = ForwardMode.DRAFT_EXTEND
    qo, kv_indptr = _replay(backend, fb, captured_bs=3)

    assert qo.tolist() == [0, 1, 4, 6]
    assert kv_indptr.tolist() == [0, 9, 22, 33]
