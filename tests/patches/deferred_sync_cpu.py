"""The v2 worker on CPU for the deferred draft sync's tests (0006): real SGLang objects run in the
overlap loop's order, with a target that samples tokens the test chooses and returns hidden states
naming their step and row, and a draft whose prefill extend is SGLang's own while its model's
forward is recorded instead of run."""

from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass

import torch

from sglang_cpu import VOCAB
from switch_helpers import NUM_DRAFT_TOKENS as N
from switch_helpers import scheduler_for_output_processing, v2_decode_batch

AUX_HIDDEN = 12  # the target's captured hidden state width (EAGLE-3: three layers)
DRAFT_HIDDEN = 8


def cpu_model_runner(pools):
    """What ForwardBatch.init_new reads from a model runner, on CPU."""
    from sglang.srt.server_args import get_global_server_args

    return types.SimpleNamespace(
        req_to_token_pool=pools.req_to_token_pool,
        token_to_kv_pool=pools.kv_pool,
        attn_backend=None,
        device="cpu",
        server_args=get_global_server_args(),
        model_is_mrope=False,
        # read from SGLang 0.5.10 on
        token_to_kv_pool_allocator=pools.allocator,
        use_ngram_embedding=False,
        is_hybrid_swa=False,
        is_draft_worker=False,
    )


class StandInTarget:
    """Samples token 1000 * step + i for request i. Hidden state row r of a step holds
    100 * step + r, so a reader can tell which step and row it came from."""

    def __init__(self, pools):
        self.runner = cpu_model_runner(pools)
        self.step = 0
        self.calls = []

    def forward_batch_generation(self, mwb):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch

        self.step += 1
        forward_batch = ForwardBatch.init_new(mwb, self.runner)
        rows = len(mwb.input_ids)
        hidden = (100 * self.step + torch.arange(rows, dtype=torch.float32))[:, None]
        tokens = torch.tensor([1000 * self.step + i for i in range(len(mwb.seq_lens))], dtype=torch.int64)
        self.calls.append(
            types.SimpleNamespace(
                mode=mwb.forward_mode,
                input_ids=mwb.input_ids.clone(),
                out_cache_loc=mwb.out_cache_loc.clone(),
                positions=forward_batch.positions.clone(),
                seq_lens=mwb.seq_lens.clone(),
                extend_prefix_lens=mwb.extend_prefix_lens,
                extend_seq_lens=mwb.extend_seq_lens,
                global_num_tokens=mwb.global_num_tokens,
                is_extend_in_batch=mwb.is_extend_in_batch,
                sampled=tokens,
            )
        )
        return GenerationBatchResult(
            logits_output=LogitsProcessorOutput(
                next_token_logits=None, hidden_states=hidden.expand(rows, AUX_HIDDEN).clone()
            ),
            next_token_ids=tokens,
        )


class RecordingDraftRunner:
    """The draft model: records the forward batch SGLang built for it; proposes token 7 + row."""

    def __init__(self, pools):
        self.__dict__.update(vars(cpu_model_runner(pools)))
        self.tp_group = None
        self.forwards = []

    def forward(self, forward_batch, **_):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        # The draft input is the object the extend hands on; keep what the model read.
        self.forwards.append((forward_batch, forward_batch.spec_info.hidden_states.clone()))
        bs = forward_batch.batch_size
        logits = torch.zeros(bs, VOCAB)
        logits[torch.arange(bs), 7 + torch.arange(bs)] = 1.0
        hidden = torch.arange(bs, dtype=torch.float32)[:, None].expand(bs, DRAFT_HIDDEN)
        return types.SimpleNamespace(
            logits_output=LogitsProcessorOutput(next_token_logits=logits, hidden_states=hidden)
        )


class StandInDraft:
    """SGLang's EagleDraftWorker prefill extend on a recorded draft model; a decode extend,
    which needs the GPU and which no fallback step may run, is recorded instead of run."""

    def __init__(self, pools):
        from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

        self.draft_runner = RecordingDraftRunner(pools)
        self.topk = 1
        self.hot_token_id = None
        self._draft_extend_for_prefill = types.MethodType(EagleDraftWorker._draft_extend_for_prefill, self)
        self.decode_extends = []

    def draft_tp_context(self, group):
        return contextlib.nullcontext()

    def _draft_extend_for_decode(self, mwb, result):
        self.decode_extends.append(
            types.SimpleNamespace(
                seq_lens=mwb.seq_lens.clone(),
                hidden=result.logits_output.hidden_states.clone(),
                accept_lens=result.accept_lens.clone(),
            )
        )
        bs = len(mwb.seq_lens)
        nxt = result.next_draft_input
        nxt.topk_p, nxt.topk_index = torch.ones(bs, 1), torch.full((bs, 1), 1)
        nxt.hidden_states = torch.zeros(bs, DRAFT_HIDDEN)


def v2_worker(env):
    from sglang.srt.server_args import get_global_server_args
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
    from sglang.srt.speculative.spec_switch import SpecSwitch
    from sglang.srt.speculative.spec_switch_v2 import DeferredDraftSyncV2

    w = object.__new__(EAGLEWorkerV2)
    args = get_global_server_args()
    w.server_args = args
    w.speculative_num_draft_tokens = N
    w.device = "cpu"
    w.req_to_token_pool = env.req_to_token_pool
    w._target_worker, w._draft_worker = StandInTarget(env), StandInDraft(env)
    w.spec_switch = SpecSwitch.from_server_args(args)
    w.deferred_draft_sync = DeferredDraftSyncV2(max_catch_up_tokens=4096)
    return w


@dataclass
class Loop:
    """The overlap loop: the result of the last launched step waits until the next launch (unless
    overlap is off for the batch, as the scheduler turns it off for some: then it is processed
    before the next launch)."""

    worker: object
    batch: object
    overlap: bool = True
    waiting: object = None

    def steps(self, n):
        results = []
        for _ in range(n):
            mwb = self.batch.get_model_worker_batch()
            result = self.worker.forward_batch_generation(mwb)
            results.append(result)
            self.batch.spec_info = result.next_draft_input
            self.batch.seq_lens = result.next_draft_input.new_seq_lens
            self.process_waiting()
            self.waiting = result
            if not self.overlap:
                self.process_waiting()
            self.batch.prepare_for_decode()
        return results

    def process_waiting(self):
        if self.waiting is not None:
            tokens = scheduler_for_output_processing()._resolve_spec_overlap_token_ids(self.waiting, self.batch)
            for req, new in zip(self.batch.reqs, tokens, strict=True):
                req.output_ids.extend(new)  # as process_batch_result_decode does for spec v2
            self.waiting = None


def speculation_comes_back(worker):
    worker.spec_switch.enable_batch_size = worker.spec_switch.disable_batch_size = 3


def off_for(env, steps, overlap=True):
    """Three requests through `steps` fallback steps, then a load low enough for speculation."""
    batch, reqs = v2_decode_batch(env, n=3)
    worker = v2_worker(env)
    loop = Loop(worker, batch, overlap=overlap)
    loop.steps(steps)
    speculation_comes_back(worker)
    return batch, reqs, worker, loop
