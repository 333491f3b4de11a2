"""A spec-v2 server on CPU for the release lines' deferred draft catch-up tests: spec_v2_cpu's
overlap loop around a real EAGLEWorkerV2, with a target whose captured hidden states name their
forward and row, and a draft whose prefill extend is SGLang's own (EagleDraftWorker's), down to
the forward batch its model would run; the model's forward is recorded instead of run."""

from __future__ import annotations

import types
from typing import Any, List

import torch
from spec_v2_cpu import spec_v2_server
from verify_cpu import StandInDraft, StandInTarget

from sglang_cpu import HIDDEN, VOCAB, make_req, model_runner_for_forward_batch

FIRST = 100  # request i's prefill samples FIRST + i
ACCEPT_ALL = 40  # the draft proposes ACCEPT_ALL + row at every step; the target agrees


class RowNamingTarget(StandInTarget):
    """The stood-in target whose captured hidden state of row r in its call c holds 1000 * c + r
    (the worker asks for every row's: CaptureHiddenMode.FULL)."""

    def forward_batch_generation(self, *args: Any, **kwargs: Any):
        result = super().forward_batch_generation(*args, **kwargs)
        # What the target read: the draft's prefill extend rotates the batch's ids in place.
        forward_batch = self.seen[-1][0]
        forward_batch.input_ids = forward_batch.input_ids.clone()
        rows = len(forward_batch.input_ids)  # a FULL capture: every row the target ran
        named = 1000 * (len(self.seen) - 1) + torch.arange(rows, dtype=torch.float32)
        result.logits_output.hidden_states = named[:, None].expand(rows, 3 * HIDDEN).clone()
        return result


class RecordingDraftModel:
    """The draft model's forward: records the forward batch and the hidden states it read, and
    proposes token 7 + i for request i."""

    def __init__(self) -> None:
        self.forwards: List[Any] = []

    @staticmethod
    def proposals(bs: int) -> List[int]:
        return [7 + i for i in range(bs)]

    def __call__(self, forward_batch: Any, **_: Any):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        forward_batch.hidden = forward_batch.spec_info.hidden_states.clone()
        self.forwards.append(forward_batch)
        bs = forward_batch.batch_size
        logits = torch.zeros(bs, VOCAB)
        logits[torch.arange(bs), torch.tensor(self.proposals(bs))] = 1.0
        hidden = torch.zeros(bs, HIDDEN)
        return types.SimpleNamespace(
            logits_output=LogitsProcessorOutput(next_token_logits=logits, hidden_states=hidden)
        )


class PrefillExtendDraft(StandInDraft):
    """The stood-in draft worker with SGLang's own prefill extend on a recording draft model; it
    counts its drafts and decode extends."""

    def __init__(self, pools: Any, server_args: Any) -> None:
        super().__init__()
        self.model = RecordingDraftModel()
        runner = model_runner_for_forward_batch(pools, server_args)
        # The stand-in's tp group and WAR event; the draft's own model config (its hidden size
        # shapes the skipped extend's stubs, and a forward batch reads it too).
        runner.__dict__.update({k: v for k, v in vars(self.draft_runner).items() if k != "model_config"})
        runner.forward, runner.canary_manager, runner.attn_backend = self.model, None, None
        self.draft_runner = runner
        self.server_args, self.speculative_algorithm = server_args, runner.spec_algorithm
        self.topk, self.seed_dsa_topk_from_draft_extend = 1, False
        self.drafts = self.decode_extends = 0

    def _draft_extend_for_prefill(self, *args: Any, **kwargs: Any):
        from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

        return EagleDraftWorker._draft_extend_for_prefill(self, *args, **kwargs)  # SGLang's own

    def draft(self, batch: Any):
        self.drafts += 1
        return super().draft(batch)

    def _draft_extend_for_decode(self, *args: Any, **kwargs: Any) -> None:
        self.decode_extends += 1
        super()._draft_extend_for_decode(*args, **kwargs)


class CatchUpServer:
    """The server and what each step sampled: a prefill samples FIRST + i for request i; at the
    k-th decode-shaped step (one row a request: a plain decode, a catch-up) request i samples
    200 + 10 * k + i; a verify accepts every draft token."""

    def __init__(self, env: types.SimpleNamespace) -> None:
        self.env, self.loop, self.worker = env, env.loop, env.worker
        self.target, self.draft = env.target, env.draft
        self.sampled: List[List[int]] = []
        self.prefilling = False
        env.model.plan = self._plan

    def _plan(self, forward_batch: Any) -> List[int]:
        bs = forward_batch.batch_size
        if forward_batch.forward_mode.is_target_verify():
            width = len(forward_batch.input_ids) // bs
            return [ACCEPT_ALL + i for i in range(bs) for _ in range(width)]
        if self.prefilling:
            return [FIRST + i for i in range(bs)]
        tokens = [200 + 10 * len(self.sampled) + i for i in range(bs)]
        self.sampled.append(tokens)
        return tokens

    def prefill(self, n: int, prefix: str = "r") -> Any:
        reqs = [make_req(f"{prefix}{i}", 5 + 3 * i, sampling={"temperature": 0.0}) for i in range(n)]
        self.prefilling = True
        batch = self.loop.prefill(reqs)
        self.prefilling = False
        self.loop.prepare_decode(batch)
        return batch

    def set_steps(self, steps: int) -> None:
        """The adaptive state's step count, as AdaptiveController's swap leaves it."""
        self.worker.speculative_num_steps = steps
        self.worker.speculative_num_draft_tokens = steps + 1

    def step(self, batch: Any) -> Any:
        steps = self.worker.speculative_num_steps
        self.draft.draft_tokens = [[ACCEPT_ALL + i] * steps for i in range(len(batch.reqs))]
        result = self.loop.run(batch)
        self.loop.prepare_decode(batch)
        return result

    def target_forwards(self) -> List[Any]:
        return [forward_batch for forward_batch, _, _ in self.target.seen]

    def target_hidden_rows(self, call: int) -> List[float]:
        rows = len(self.target_forwards()[call].input_ids)
        return [float(1000 * call + r) for r in range(rows)]

    def tokens_fed(self, i: int, n: int) -> List[int]:
        """The first n tokens request i of the first prefill was fed after its prompt: its
        prefill's, then each decode-shaped step's sample."""
        return ([FIRST + i] + [step[i] for step in self.sampled])[:n]


def catch_up_server(tmp_path: Any, monkeypatch: Any, **server_overrides: Any) -> CatchUpServer:
    env = spec_v2_server(tmp_path, monkeypatch, **server_overrides)
    env.target = env.worker._target_worker = RowNamingTarget(env.pools, env.server_args, env.model)
    env.draft = env.worker._draft_worker = PrefillExtendDraft(env.pools, env.server_args)
    return CatchUpServer(env)
