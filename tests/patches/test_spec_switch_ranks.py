"""Two tensor-parallel ranks take the same switch decisions (0004): each rank's scheduler builds its
own batch from the same requests, in its own memory pools, and the v2 worker decides on it.

Rank 1's pools hold other allocations first, so its KV slots differ from rank 0's, as they may on
a real server; what the decision reads (the decode batch size, grammars) must not. Only the GPU
forward passes are stood in for: a plain decode records the batch size, a speculative step stops
at the draft worker's `draft` call.
"""

from __future__ import annotations

import contextlib
import types

from sglang_cpu import make_req, prefilled_decode_batch
from switch_helpers import v2_env

RAMP = [2, 6, 12, 20, 9, 5, 3, 14, 4, 1]  # running requests per step: up past N=8, down to M=4
DISABLE, ENABLE = 8, 4


class Speculated(Exception):
    pass


def _deferred_draft_sync():
    """The deferred draft sync's bookkeeping, from the patch after the v2 switch on."""
    try:
        from sglang.srt.speculative.spec_switch_v2 import DeferredDraftSyncV2
    except ImportError:
        return None
    return DeferredDraftSyncV2(max_catch_up_tokens=4096)


def _worker():
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
    from sglang.srt.speculative.spec_switch import SpecSwitch

    worker = object.__new__(EAGLEWorkerV2)
    worker.spec_switch = SpecSwitch(DISABLE, ENABLE)
    worker.deferred_draft_sync = _deferred_draft_sync()
    worker.steps = []
    worker.forward_plain_decode = lambda mwb, **_: worker.steps.append(("plain", len(mwb.seq_lens)))

    def draft(mwb):
        worker.steps.append(("speculate", len(mwb.seq_lens)))
        raise Speculated

    worker._draft_worker = types.SimpleNamespace(
        draft_tp_context=lambda group: contextlib.nullcontext(),
        draft_runner=types.SimpleNamespace(tp_group=None),
        draft=draft,
    )
    return worker


def _rank_steps(env, rank: int):
    if rank == 1:  # other allocations first: this rank's KV slots differ from rank 0's
        env.allocator.alloc(37)
    worker = _worker()
    for step, n in enumerate(RAMP):
        reqs = [make_req(f"s{step}r{i}", prompt_len=4 + i % 5) for i in range(n)]
        batch = prefilled_decode_batch(env, reqs, [100 + i for i in range(n)], overlap=True, topk=1)
        mwb = batch.get_model_worker_batch()
        with contextlib.suppress(Speculated):
            worker.forward_batch_generation(mwb)
        for req in reqs:
            env.req_to_token_pool.free(req)
        env.allocator.free(batch.out_cache_loc)
    return worker.steps, worker.spec_switch.status(), batch.out_cache_loc.tolist()


def test_ranks_take_the_same_decisions(tmp_path, monkeypatch):
    rank0 = _rank_steps(v2_env(tmp_path / "rank0", monkeypatch), 0)
    rank1 = _rank_steps(v2_env(tmp_path / "rank1", monkeypatch), 1)
    steps0, status0, slots0 = rank0
    steps1, status1, slots1 = rank1
    assert slots0 != slots1  # the ranks' memory differs
    assert steps0 == steps1 and status0 == status1
    kinds = [kind for kind, _ in steps0]
    assert "plain" in kinds and "speculate" in kinds
    assert [bs for _, bs in steps0] == RAMP
    flips = sum(1 for a, b in zip(kinds, kinds[1:], strict=False) if a != b)
    assert status0 == (
        f"spec-switch: on={kinds[-1] == 'speculate'} spec_steps={kinds.count('speculate')} "
        f"fallback_steps={kinds.count('plain')} switches={flips}"
    )


def test_rank_decisions_follow_the_batch_not_the_step_count(tmp_path, monkeypatch):
    steps, _, _ = _rank_steps(v2_env(tmp_path, monkeypatch), 0)
    on = True
    for kind, bs in steps:  # hysteresis recomputed from the batch sizes alone
        on = bs <= DISABLE if on else bs <= ENABLE
        assert kind == ("speculate" if on else "plain"), (kind, bs)
