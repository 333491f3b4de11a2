"""The plain-decode patch (v0.5.23 line): adaptive spec's steps=0 batches as plain target decodes.

Real SGLang 0.5.23 objects on CPU: the graph runner's mode check, the decision which batches take
the plain route, and the step itself on a speculative decode batch built by a real prefill; the
target model's forward is the one thing stood in for (it builds the ForwardBatch as the real worker
does, records it and samples tokens the test chooses).
"""

from __future__ import annotations

import types

import pytest
import torch

from sglang_cpu import HIDDEN, VOCAB, sglang_module

NUM_REQS = 4
SAMPLED = [300 + i for i in range(NUM_REQS)]


def graph_runner(*, plain_decode: bool, max_bs: int):
    """A DecodeCudaGraphRunner of an EAGLE-3 target as its admission check sees it (capture not
    run): the steps=0 state's with the patch (DECODE, one token a request), or upstream's
    TARGET_VERIFY set of that state (one draft token a request, the same width)."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    runner = object.__new__(DecodeCudaGraphRunner)
    if plain_decode:
        runner.plain_decode = True
    runner.ragged_verify_mode = runner.require_mlp_tp_gather = runner.require_mlp_sync = False
    runner.enable_pdmux = runner.disable_padding = runner.record_nolora_graph = False
    runner.is_encoder_decoder = runner.enable_two_batch_overlap = False
    runner.max_bs, runner.captured_req_width = max_bs, 1
    runner.capture_forward_mode = ForwardMode.DECODE if plain_decode else ForwardMode.TARGET_VERIFY
    runner.capture_hidden_mode = CaptureHiddenMode.FULL
    runner.model_runner = types.SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.EAGLE3, is_draft_worker=False)
    return runner


def mode_batch(mode, bs: int):
    """A one-token-a-request ForwardBatch of this mode; a TARGET_VERIFY one carries upstream's
    steps=0 verify input (one draft token a request)."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    spec_info = None
    if mode.is_target_verify():
        spec_info = EagleVerifyInput(
            draft_token=torch.zeros(bs, dtype=torch.int64), custom_mask=None, positions=torch.full((bs,), 10),
            retrieve_index=None, retrieve_next_token=None, retrieve_next_sibling=None, retrieve_cum_len=None,
            spec_steps=0, topk=1, draft_token_num=1, capture_hidden_mode=CaptureHiddenMode.FULL,
            seq_lens_sum=None, seq_lens_cpu=None,
        )  # fmt: skip
    return ForwardBatch(
        forward_mode=mode, batch_size=bs, input_ids=torch.zeros(bs, dtype=torch.int64),
        req_pool_indices=torch.arange(bs), seq_lens=torch.full((bs,), 10),
        out_cache_loc=torch.zeros(bs, dtype=torch.int64), seq_lens_sum=10 * bs,
        capture_hidden_mode=CaptureHiddenMode.FULL, spec_info=spec_info,
    )  # fmt: skip


def test_the_plain_decode_set_replays_only_decode_batches():
    """Adaptive spec swaps one target runner per step count into place; with the patch the steps=0
    one captures DECODE graphs. A grammar or logprob batch of that state still runs a one-token
    verify, as wide as a decode, which must not replay them."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    plain = graph_runner(plain_decode=True, max_bs=64)
    assert plain.can_run_graph(mode_batch(ForwardMode.DECODE, bs=40))
    assert not plain.can_run_graph(mode_batch(ForwardMode.TARGET_VERIFY, bs=40))
    assert not plain.can_run_graph(mode_batch(ForwardMode.DECODE, bs=65))
    # Upstream's set of that state replays the one-token verify (the batch itself is replayable).
    assert graph_runner(plain_decode=False, max_bs=64).can_run_graph(mode_batch(ForwardMode.TARGET_VERIFY, bs=40))


def test_the_plain_decode_set_is_captured_without_a_verify_input():
    """A DECODE batch carrying a spec_info is a draft decode to the attention backends; the plain
    decode graphs are captured as a non-speculative server captures its own."""
    assert graph_runner(plain_decode=True, max_bs=8).get_spec_info(8) is None


class RecordingTarget:
    """The target worker's forward, stood in for: it builds the ForwardBatch as TpModelWorker does
    (ForwardBatch.init_new, SGLang's own), records it, and samples the tokens the test chose."""

    def __init__(self, pools, server_args, events):
        from sglang_cpu import model_runner_for_forward_batch

        self.model_runner = model_runner_for_forward_batch(pools, server_args)
        self.model_runner.decode_cuda_graph_runner = None  # the state's graph runner
        self.model_runner.shared_read_done_event = None
        self.replays_a_graph = False  # a DECODE graph replay publishes the WAR read-done event
        self.events = events
        self.seen = None

    def forward_batch_generation(self, batch, *, capture_hidden_mode=None):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch

        self.events.append("forward")
        self.seen = ForwardBatch.init_new(
            batch, self.model_runner, capture_hidden_mode=capture_hidden_mode, return_hidden_states_before_norm=False
        )
        if self.replays_a_graph:
            self.model_runner.shared_read_done_event = "read-done event of this step"
        bs = self.seen.batch_size
        # EAGLE-3 captures three target layers: the draft extend reads [bs, 3 * hidden].
        logits = LogitsProcessorOutput(
            next_token_logits=torch.zeros(bs, VOCAB), hidden_states=torch.ones(bs, 3 * HIDDEN)
        )
        return GenerationBatchResult(
            logits_output=logits, next_token_ids=torch.tensor(SAMPLED), can_run_cuda_graph=True
        )


@pytest.fixture
def env(tmp_path, monkeypatch):
    from spec_v2_cpu import spec_v2_decode_batch

    from sglang_cpu import (
        init_single_rank_groups,
        make_pools,
        make_req,
        make_server_args,
        use_torch_kernels,
        write_tiny_llama_config,
    )

    server_args = make_server_args(write_tiny_llama_config(tmp_path / "model"))
    use_torch_kernels(monkeypatch)
    init_single_rank_groups()
    pools = make_pools(server_args)
    reqs = [make_req(f"r{i}", prompt_len=5 + 4 * i) for i in range(NUM_REQS)]
    batch = spec_v2_decode_batch(pools, reqs, [100 + i for i in range(NUM_REQS)])
    events = []
    return {"pools": pools, "reqs": reqs, "batch": batch, "events": events,
            "target": RecordingTarget(pools, server_args, events)}  # fmt: skip


def _publisher(env):
    """The scheduler's on_publish (partial(FutureMap.publish, future_indices)), recorded in events."""
    future_map, rows = env["pools"].future_map, env["batch"].req_pool_indices

    def publish(new_seq_lens):
        env["events"].append("publish")
        future_map.publish(rows, new_seq_lens)

    return publish


def _step(env):
    from sglang.srt.speculative.adaptive_plain_decode import forward_plain_decode

    return forward_plain_decode(env["target"], env["batch"], _publisher(env))


@pytest.mark.parametrize("host_lengths", [True, False])
def test_the_step_is_a_plain_decode_on_the_reserved_slots(env, host_lengths):
    """host_lengths False: a backend that opts out of host lengths (triton), for which the
    FutureMap leaves seq_lens_cpu and seq_lens_sum unset."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

    batch, reqs = env["batch"], env["reqs"]
    if not host_lengths:
        batch.seq_lens_cpu = batch.seq_lens_sum = None
    s = batch.seq_lens.clone()
    pending = batch.spec_info.bonus_tokens.tolist()
    allocated = [r.kv.kv_allocated_len for r in reqs]
    free = batch.token_to_kv_pool_allocator.available_size()

    _step(env)

    seen = env["target"].seen
    assert seen.forward_mode == ForwardMode.DECODE and seen.spec_info is None
    assert seen.capture_hidden_mode == CaptureHiddenMode.FULL  # what the DECODE graphs hold
    assert seen.input_ids.tolist() == pending and seen.input_ids.dtype == torch.int64
    rows = batch.req_to_token_pool.req_to_token[batch.req_pool_indices, s]
    assert seen.out_cache_loc.tolist() == rows.tolist()
    assert seen.positions.tolist() == s.tolist()
    assert seen.seq_lens.tolist() == (s + 1).tolist()
    if host_lengths:
        assert seen.seq_lens_cpu.tolist() == (s + 1).tolist() and seen.seq_lens_sum == int(s.sum()) + NUM_REQS
    else:
        assert seen.seq_lens_cpu is None and seen.seq_lens_sum is None
    # prepare_for_decode reserved the slot; the step takes it and allocates nothing.
    assert [r.kv.kv_allocated_len for r in reqs] == allocated
    assert batch.token_to_kv_pool_allocator.available_size() == free


def test_the_result_has_the_layout_of_a_zero_step_verify(env):
    batch = env["batch"]
    draft_input = batch.spec_info
    seq_lens, seq_lens_cpu, seq_lens_sum = batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum
    s = seq_lens.clone()

    result = _step(env)

    assert result.next_token_ids.tolist() == SAMPLED and result.next_token_ids.dtype == torch.int32
    assert result.accept_lens.tolist() == [1] * NUM_REQS and result.accept_lens.dtype == torch.int32
    assert result.new_seq_lens.tolist() == (s + 1).tolist()
    assert result.speculative_num_draft_tokens == 1  # the output processor's stride
    assert result.next_draft_input.bonus_tokens.tolist() == SAMPLED
    assert result.can_run_cuda_graph
    # Left in spec-v2 form for the draft extend: the scheduler's own length tensors, unchanged.
    assert batch.seq_lens is seq_lens and batch.seq_lens_cpu is seq_lens_cpu
    assert batch.seq_lens_sum == seq_lens_sum
    assert torch.equal(seq_lens, s) and torch.equal(seq_lens_cpu, s)
    assert batch.spec_info is draft_input
    rows = batch.req_to_token_pool.req_to_token[batch.req_pool_indices, s]
    assert batch.out_cache_loc.tolist() == rows.tolist()


def test_the_next_lengths_are_published_once_before_the_forward(env):
    """A plain decode's new lengths are s + 1 whatever it samples; published after the forward,
    a backend that reads them on the host (flashinfer) would wait for this step's GPU work."""
    pools, batch = env["pools"], env["batch"]
    s = batch.seq_lens.clone()
    _step(env)
    assert env["events"] == ["publish", "forward"]
    assert pools.future_map.new_seq_lens_buf[batch.req_pool_indices].tolist() == (s + 1).tolist()


def test_which_batches_take_the_plain_route(env, monkeypatch):
    from sglang.srt.speculative.adaptive_plain_decode import runs_as_plain_decode

    batch, model_runner = env["batch"], env["target"].model_runner
    model_runner.decode_cuda_graph_runner = graph_runner(plain_decode=True, max_bs=8)
    assert runs_as_plain_decode(batch, model_runner)  # on by default
    monkeypatch.setenv("SGLANG_SPEC_ZERO_STEP_PLAIN_DECODE", "0")  # upstream's verify, to compare
    assert not runs_as_plain_decode(batch, model_runner)
    monkeypatch.setenv("SGLANG_SPEC_ZERO_STEP_PLAIN_DECODE", "1")
    assert runs_as_plain_decode(batch, model_runner)

    batch.return_logprob = True  # the spec-v2 logprob layout comes from the verify
    assert not runs_as_plain_decode(batch, model_runner)
    batch.return_logprob, batch.has_grammar = False, True  # token masks come from the verify
    assert not runs_as_plain_decode(batch, model_runner)
    batch.has_grammar = False
    batch.hisparse_coordinator = object()  # HiSparse commits accepted tokens in verify
    assert not runs_as_plain_decode(batch, model_runner)
    batch.hisparse_coordinator = None
    # A state whose graphs are a verify set (the server's own start-up state at steps=0).
    model_runner.decode_cuda_graph_runner = graph_runner(plain_decode=False, max_bs=8)
    assert not runs_as_plain_decode(batch, model_runner)
    model_runner.decode_cuda_graph_runner = None  # --disable-cuda-graph
    assert runs_as_plain_decode(batch, model_runner)


def test_which_models_and_servers_keep_the_verify(env, monkeypatch):
    import sglang.srt.speculative.adaptive_plain_decode as plain
    from sglang.srt.runtime_context import get_parallel

    model_runner = env["target"].model_runner
    monkeypatch.setenv("SGLANG_SPEC_ZERO_STEP_PLAIN_DECODE", "1")
    assert plain.zero_step_plain_decode_enabled(model_runner)
    cases = [  # (object, attribute, value): each alone sends the state back to the verify
        (model_runner.model_config, "model_is_mrope", True),  # positions from the verify input
        (model_runner, "watermark_state", object()),  # verify records the speculative tokens
        # DSV4's KV cache clears its unaccepted compressed states in verify.
        (model_runner, "token_to_kv_pool", types.SimpleNamespace(clear_unaccepted_c128_draft_states=None)),
    ]
    for obj, name, value in cases:
        with monkeypatch.context() as m:
            m.setattr(obj, name, value)
            assert not plain.zero_step_plain_decode_enabled(model_runner), name
    # PP stages relay the verify chain (a two-stage topology, as the validator checks it).
    with get_parallel().override(pp_size=2, pp_group=types.SimpleNamespace(world_size=2)):
        assert not plain.zero_step_plain_decode_enabled(model_runner)
    assert plain.zero_step_plain_decode_enabled(model_runner)
    # A hybrid linear-attention model (derived from its config): it commits recurrent state in verify.
    monkeypatch.setattr(plain, "mambaish_config", lambda config: object())
    assert not plain.zero_step_plain_decode_enabled(model_runner)


class RecordingDraft:
    """The draft worker, stood in for: its draft extend records the batch it is handed."""

    def __init__(self, events):
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.events = events
        self.parallel_layout = types.SimpleNamespace(tp_group=None)  # draft TP is the target's
        # What the skipped draft extend's stub reads to shape the FutureMap's entries.
        self.draft_runner = types.SimpleNamespace(
            spec_algorithm=SpeculativeAlgorithm.EAGLE3, shared_read_done_event=None,
            model_config=types.SimpleNamespace(spec_hidden_size=HIDDEN, dtype=torch.float32))  # fmt: skip
        self.extended = None

    def _draft_extend_for_decode(self, batch, result, *, kv_loc_plan=None):
        self.events.append("draft extend")
        self.extended = {"seq_lens": batch.seq_lens.tolist(), "out_cache_loc": batch.out_cache_loc.tolist(),
                         "spec_info": batch.spec_info, "result": result, "kv_loc_plan": kv_loc_plan}  # fmt: skip


def _zero_step_worker(env):
    """An EAGLEWorkerV2 (object.__new__) whose adaptive state is at 0 steps, no controller."""
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    worker = object.__new__(EAGLEWorkerV2)
    worker.adaptive_controller, worker.speculative_num_steps = None, 0
    worker.topk, worker.device = 1, "cpu"
    worker._target_worker, worker._draft_worker = env["target"], RecordingDraft(env["events"])
    catch_up = sglang_module("sglang.srt.speculative.adaptive_draft_catch_up")
    if catch_up is not None:  # the line's 0005: the draft's debts, as __init__ sets them
        worker.draft_catch_up = catch_up.DraftCatchUp(max_tokens=4096)
    return worker


def test_the_worker_runs_a_zero_step_batch_as_a_plain_decode_then_the_draft_extend(env, monkeypatch):
    """EAGLEWorkerV2.forward_batch_generation, SGLang's own, at steps=0 with the variable set."""
    monkeypatch.setenv("SGLANG_SPEC_ZERO_STEP_PLAIN_DECODE", "1")
    batch = env["batch"]
    worker = _zero_step_worker(env)
    draft_input, s = batch.spec_info, batch.seq_lens.clone()
    slots = batch.req_to_token_pool.req_to_token[batch.req_pool_indices, s].tolist()

    result = worker.forward_batch_generation(batch, on_publish=_publisher(env))

    assert env["events"] == ["publish", "forward", "draft extend"]  # one publish, before the forward
    extended = worker._draft_worker.extended
    assert extended["result"] is result and extended["spec_info"] is draft_input
    assert extended["seq_lens"] == s.tolist() and extended["out_cache_loc"] == slots
    assert extended["kv_loc_plan"] is None  # as after upstream's steps=0 verify: the extend plans its own
    assert result.next_token_ids.tolist() == SAMPLED and result.speculative_num_draft_tokens == 1


@pytest.mark.parametrize("graph", [True, False])
def test_without_the_draft_extend_the_barrier_waits_on_the_targets_read(env, monkeypatch, graph):
    """The scheduler's WAR barrier waits on the read-done event of the worker's
    last_shared_read_runner (the draft runner), which the skipped draft extend no longer
    publishes: the target's DECODE graph replay did, so it is handed over. An eager step
    publishes none, and an earlier step's event must not stand in for it."""
    monkeypatch.setenv("SGLANG_SPEC_ZERO_STEP_PLAIN_DECODE", "1")
    monkeypatch.setenv("SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND", "1")
    worker, target = _zero_step_worker(env), env["target"]
    target.replays_a_graph = graph
    target.model_runner.shared_read_done_event = "an earlier step's event"

    result = worker.forward_batch_generation(env["batch"])

    assert env["events"] == ["forward"]
    barrier_runner = worker.last_shared_read_runner
    assert barrier_runner is worker._draft_worker.draft_runner
    assert barrier_runner.shared_read_done_event == ("read-done event of this step" if graph else None)
    assert target.model_runner.shared_read_done_event is None
    assert result.next_draft_input.topk_index.shape == (NUM_REQS, 1)  # upstream's stub, as before
