"""Trained fixtures: a Llama target trained on a code corpus and an EAGLE-3 draft trained on it.

Where the other fixtures are degenerate (the "exact" pair accepts everything, the "random" draft
nothing), these behave like a real pair: peaked but not trivial outputs, and a draft that agrees
with the target often, not always. One set holds:

- ``tokenizer``: byte-level BPE trained on the corpus (``bench.models.corpus``: Python sources of the
  machine's standard library, a sorted file list cut at a byte budget);
- ``target-trained``: ``trained_layers`` Llama layers trained on the corpus, followed by pass-through
  layers up to ``small_layers`` (every weight zero but the norms: ``o_proj`` and ``down_proj`` add
  nothing, so the residual stream passes through unchanged). EAGLE-3 captures the states before
  layers 2, L/2 and L-3; with at most 2 trained layers those are the trained stack's output;
- ``target-trained-gpu-bound`` (when ``gpu_bound_layers``): the same trained layers followed by
  pass-through layers up to ``gpu_bound_layers``. With the Llama-3-8B shape a step then reads what
  an 8B model reads, and it captures the same states, so its outputs are the small target's;
- ``draft-trained``: an EAGLE-3 draft (``bench.models.eagle3_draft``) trained on those captured states to
  predict the target's next token, unrolled over the draft steps SGLang runs. It serves both targets;
- ``prompts.jsonl``: code snippets from the held-out end of the corpus, for the greedy-equality
  tests: text like what the target learned, unlike the benchmark's English coding questions, on
  which 5 of 479 greedy outputs flipped at near-ties; of the candidate snippets, those on which the
  trained target's greedy path is furthest from a tie (``bench.models.tie_free``).

``manifest.json`` records what was made: the corpus digest, the target's loss, the draft's top-1
agreement per step on held-out text, and how long each phase took. Deterministic from the seed:
the same data order and initial weights, PyTorch's deterministic kernels, and attention in SDPA's math
backend (cuDNN's attention backward, which SDPA picks on an H200, has no deterministic variant: two
generations of version 4 with one key differed, held-out loss 3.682 against 3.666). Any kernel
PyTorch still reports as nondeterministic is listed in the manifest's ``figures.nondeterministic``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from bench.models.corpus import Corpus, code_corpus, code_prompts
from bench.models.tie_free import ScoredPrompt, greedy_margins, most_tie_free, served_copy
from bench.models.trained_params import (
    HELD_OUT_SHARE,
    PROMPTS_FILE,
    TrainedParams,
    TrainingError,
    captured_layers,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainFigures:
    """What the training made, measured on held-out text."""

    target_loss: float  # cross entropy, nats per token
    target_train_loss: float  # the last 10 steps' mean
    draft_agreement: tuple[float, ...]  # top-1 agreement with the target, per draft step
    target_seconds: float
    draft_seconds: float
    nondeterministic: tuple[str, ...] = ()  # PyTorch's warnings of kernels that ran without a deterministic variant

    @property
    def draft_expected_accept_length(self) -> float:
        from bench.models.eagle3_draft import chain_accept_length

        return chain_accept_length(list(self.draft_agreement))


def _say(msg: str, quiet: bool) -> None:
    if not quiet:
        logger.info(f"fixtures: {msg}")


@contextlib.contextmanager
def deterministic_training(seed: int) -> Iterator[list[str]]:
    """Seeded, deterministic kernels and math attention inside; yields the nondeterminism warnings seen.

    warn_only: a kernel without a deterministic variant is reported, not an error that would leave a
    bare machine without fixtures."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.manual_seed(seed)
    was = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    seen: list[str] = []
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with sdpa_kernel(SDPBackend.MATH), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield seen
        seen.extend(dict.fromkeys(str(w.message) for w in caught if "determinis" in str(w.message)))
    finally:
        torch.use_deterministic_algorithms(was[0], warn_only=was[1])


def tokenize(corpus: Corpus, tokenizer: Any) -> Any:
    import torch

    lines = corpus.text.splitlines(keepends=True)
    chunks = ["".join(lines[start : start + 2000]) for start in range(0, len(lines), 2000)]
    ids: list[int] = []
    for row in tokenizer(chunks, add_special_tokens=False)["input_ids"]:
        ids.extend(row)
    return torch.tensor(ids, dtype=torch.int64)


def batches(ids: Any, params: TrainedParams, steps: int, seed: int, span: tuple[int, int]) -> Any:
    """steps batches of [batch, seq_len + 1] windows drawn (seeded) from ids[span[0]:span[1]]."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lo, hi = span
    need = params.seq_len + 1
    if hi - lo < need:
        raise TrainingError(f"the corpus gives {hi - lo} tokens, fewer than one window of {need}: raise corpus_bytes")
    for _ in range(steps):
        starts = torch.randint(lo, hi - need + 1, (params.batch,), generator=g)
        yield torch.stack([ids[s : s + need] for s in starts.tolist()])


def _lr(step: int, steps: int, peak: float) -> float:
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))


def train_loop(module: Any, loss_of: Callable[[Any], Any], data: Any, steps: int, lr: float) -> float:
    """AdamW with warm-up and cosine decay, bf16 autocast on the GPU; returns the last 10 steps' mean loss."""
    import torch

    opt = torch.optim.AdamW(
        [p for p in module.parameters() if p.requires_grad], lr=lr, betas=(0.9, 0.95), weight_decay=0.1
    )
    device_type = next(module.parameters()).device.type
    recent: list[float] = []
    for step, batch in enumerate(data):
        for group in opt.param_groups:
            group["lr"] = _lr(step, steps, lr)
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=device_type == "cuda"):
            loss = loss_of(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        recent = (recent + [float(loss.detach())])[-10:]
    return sum(recent) / max(1, len(recent))


def _target_loss(model: Any, x: Any) -> Any:
    from torch.nn import functional as F

    logits = model(input_ids=x[:, :-1], use_cache=False).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


def _draft_step(draft: Any, target: Any, x: Any, params: TrainedParams) -> tuple[Any, list[float]]:
    import torch

    from bench.models.eagle3_draft import make_batch, unrolled_loss
    from bench.models.trained_models import captured_features, target_states

    with torch.no_grad():
        states, logits = target_states(target, x)
        feats = captured_features(states, params.small_layers)
        batch = make_batch(x, target.model.embed_tokens, feats, logits, params.draft_unroll)
    return unrolled_loss(draft, batch)


def _held_out(
    fn: Callable[[Any], Any], ids: Any, params: TrainedParams, span: tuple[int, int], n: int = 8
) -> list[Any]:
    import torch

    with (
        torch.no_grad(),
        torch.autocast(params.device.split(":")[0], dtype=torch.bfloat16, enabled=params.device.startswith("cuda")),
    ):
        return [fn(b.to(params.device)) for b in batches(ids, params, n, params.seed + 99, span)]


def held_out_span(n_tokens: int) -> tuple[int, int]:
    return int(n_tokens * (1 - HELD_OUT_SHARE)), n_tokens


def choose_prompts(params: TrainedParams, target: Any, tokenizer: Any, held_out_text: str) -> list[ScoredPrompt]:
    """The held-out snippets on which the target's greedy path is furthest from a tie."""
    whole_lines = held_out_text[held_out_text.find("\n") + 1 :]  # the split falls inside a line
    candidates = code_prompts(whole_lines, params.prompt_candidates)
    rows = tokenizer(candidates, add_special_tokens=False)["input_ids"]
    margins = greedy_margins(served_copy(target, params.dtype), rows, params.prompt_new_tokens, params.device)
    return most_tie_free(candidates, margins, params.prompt_count)


def write_prompts(path: Path, prompts: list[ScoredPrompt]) -> None:
    rows = [
        json.dumps({"id": f"held-out-{i:03d}", "prompt": p.text, "least_margin": round(p.least_margin, 6)})
        for i, p in enumerate(prompts)
    ]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def train_pair(params: TrainedParams, ids: Any, vocab: int, quiet: bool) -> tuple[Any, Any, TrainFigures]:
    """Train the target, then the draft on it; returns both and what they reached."""
    with deterministic_training(params.seed) as nondeterministic:
        target, draft, figures = _train_pair(params, ids, vocab, quiet)
    return target, draft, dataclasses.replace(figures, nondeterministic=tuple(nondeterministic))


def _train_pair(params: TrainedParams, ids: Any, vocab: int, quiet: bool) -> tuple[Any, Any, TrainFigures]:
    from bench.models.trained_models import new_draft, new_target

    held = held_out_span(len(ids))
    train = (0, held[0])
    t0 = time.monotonic()
    target = new_target(params, vocab)
    data = (b.to(params.device) for b in batches(ids, params, params.target_steps, params.seed, train))
    train_loss = train_loop(target, lambda x: _target_loss(target, x), data, params.target_steps, params.target_lr)
    losses = _held_out(lambda x: _target_loss(target, x), ids, params, held)
    held_loss = sum(float(v) for v in losses) / len(losses)
    t1 = time.monotonic()
    _say(
        f"target: {params.target_steps} steps, loss {train_loss:.3f} (held-out {held_loss:.3f}) in {t1 - t0:.0f}s",
        quiet,
    )
    target.requires_grad_(False)
    draft = new_draft(params, vocab, target)
    data = (b.to(params.device) for b in batches(ids, params, params.draft_steps, params.seed + 1, train))
    train_loop(draft, lambda x: _draft_step(draft, target, x, params)[0], data, params.draft_steps, params.draft_lr)
    agreements = [a for _, a in _held_out(lambda x: _draft_step(draft, target, x, params), ids, params, held)]
    agreement = tuple(sum(a[k] for a in agreements) / len(agreements) for k in range(params.draft_unroll))
    t2 = time.monotonic()
    _say(
        f"draft: {params.draft_steps} steps, held-out agreement per step {[round(a, 3) for a in agreement]} "
        f"in {t2 - t1:.0f}s",
        quiet,
    )
    return target, draft, TrainFigures(held_loss, train_loss, agreement, t1 - t0, t2 - t1)


def write_set(tmp: Path, params: TrainedParams, target: Any, draft: Any, vocab: int, tokdir: Path) -> None:
    """The checkpoints SGLang loads, each with the tokenizer beside it."""
    from bench.models.tokenizer import copy_tokenizer
    from bench.models.trained_models import extended_state, write_draft, write_target

    trained = target.state_dict()
    names = {"target-trained": params.small_layers, "target-trained-gpu-bound": params.gpu_bound_layers}
    for name, layers in names.items():
        if layers:
            write_target(tmp / name, extended_state(trained, params, layers), params, vocab, layers)
    write_draft(tmp / "draft-trained", draft, params, vocab)
    copy_tokenizer(tokdir, tmp, params.pairs())


def _prompts(tmp: Path, params: TrainedParams, target: Any, tokenizer: Any, ids: Any, quiet: bool) -> dict[str, Any]:
    """prompts.jsonl from the held-out tokens; returns the manifest's entry for it."""
    t0 = time.monotonic()
    lo, hi = held_out_span(len(ids))
    held_out_text = tokenizer.decode(ids[lo:hi].tolist(), clean_up_tokenization_spaces=False)
    prompts = choose_prompts(params, target, tokenizer, held_out_text)
    write_prompts(tmp / PROMPTS_FILE, prompts)
    least = min(p.least_margin for p in prompts)
    seconds = time.monotonic() - t0
    _say(
        f"prompts: {len(prompts)} of {params.prompt_candidates} held-out snippets, least greedy margin "
        f"{least:.4f} nats over {params.prompt_new_tokens} tokens, in {seconds:.0f}s",
        quiet,
    )
    return {
        "file": PROMPTS_FILE,
        "count": params.prompt_count,
        "from": "held-out corpus text",
        "candidates": params.prompt_candidates,
        "new_tokens": params.prompt_new_tokens,
        "least_margin": least,
    }


def build(tmp: Path, params: TrainedParams, quiet: bool) -> dict[str, Any]:
    """Corpus, tokenizer, training, prompts and checkpoints into tmp; returns the manifest."""
    from transformers import PreTrainedTokenizerFast

    from bench.models.tokenizer import build_tokenizer
    from bench.models.trained_models import draft_parameter_count, parameter_count

    params.check()
    t0 = time.monotonic()
    corpus = code_corpus(params.corpus_bytes)
    tokdir = tmp / "tokenizer"
    vocab = build_tokenizer(tokdir, params.vocab, corpus.text.splitlines())
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tokdir))
    ids = tokenize(corpus, tokenizer)
    t1 = time.monotonic()
    _say(
        f"corpus: {len(corpus.files)} files, {corpus.size} bytes, {len(ids)} tokens (vocab {vocab}) "
        f"from {corpus.root} in {t1 - t0:.0f}s",
        quiet,
    )
    target, draft, figures = train_pair(params, ids, vocab, quiet)
    t_prompts = time.monotonic()
    prompts = _prompts(tmp, params, target, tokenizer, ids, quiet)
    t2 = time.monotonic()
    write_set(tmp, params, target, draft, vocab, tokdir)
    t3 = time.monotonic()
    _say(f"checkpoints written in {t3 - t2:.0f}s", quiet)
    reference_layers = params.gpu_bound_layers or params.small_layers
    return {
        "kind": "trained",
        "params": dataclasses.asdict(params),
        "key": params.key(),
        "vocab": vocab,
        "pairs": params.pairs(),
        "figures": {
            **dataclasses.asdict(figures),
            "draft_expected_accept_length": figures.draft_expected_accept_length,
        },
        "corpus": {
            "root": str(corpus.root),
            "files": len(corpus.files),
            "bytes": corpus.size,
            "sha256": corpus.digest,
            "tokens": len(ids),
        },
        "prompts": prompts,
        "captured_layers": {str(n): captured_layers(n) for n in (params.small_layers, params.gpu_bound_layers) if n},
        "draft_to_target_weights": draft_parameter_count(params, vocab)
        / parameter_count(params, vocab, reference_layers),
        "seconds": {
            "corpus_and_tokenizer": t1 - t0,
            "target": figures.target_seconds,
            "draft": figures.draft_seconds,
            "prompts": t2 - t_prompts,
            "write": t3 - t2,
            "total": t3 - t0,
        },
    }
