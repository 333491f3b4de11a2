"""The trained fixture set's parameters: what bench.models.trained trains and bench.models.trained_models builds."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from bench.errors import BenchError

GENERATOR_VERSION = 5  # 2: blank lines kept in the training text; checkpoints in `dtype`; 3: prompts.jsonl;
# 4: the prompts furthest from a greedy tie; 5: deterministic attention in training
PROMPTS_FILE = "prompts.jsonl"  # code snippets from the held-out text, for the greedy-equality tests
HELD_OUT_SHARE = 0.02  # the corpus's last tokens, never trained on
TRAINED_PAIRS = {
    "trained": ("target-trained", "draft-trained"),
    "trained-gpu-bound": ("target-trained-gpu-bound", "draft-trained"),
}


class TrainingError(BenchError):
    """Parameters or data that cannot make a trained set."""


@dataclass(frozen=True)
class TrainedParams:
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    intermediate: int = 14336
    trained_layers: int = 2
    small_layers: int = 8
    gpu_bound_layers: int = 32  # 0: no GPU-bound variant
    draft_intermediate: int = 4096
    vocab: int = 4096
    max_positions: int = 8192
    corpus_bytes: int = 12_000_000  # about all of a standard library's non-test sources
    seq_len: int = 512
    batch: int = 32
    target_steps: int = 300  # about two passes: more and the target learns the corpus by heart
    target_lr: float = 6e-4
    draft_steps: int = 400
    draft_lr: float = 1e-3
    draft_unroll: int = 3  # draft steps trained (SGLang's --speculative-num-steps)
    prompt_count: int = 512  # held-out code prompts written beside the checkpoints (the GPU ramp sends 479)
    prompt_candidates: int = 2048  # held-out snippets scored; the prompt_count furthest from a greedy tie are kept
    prompt_new_tokens: int = 32  # greedy tokens scored per prompt (the GPU tests' SGL_TEST_NEW_TOKENS)
    seed: int = 1234
    device: str = "cuda"
    # The checkpoints' dtype, which SGLang serves them in. float16 rather than bfloat16: three more
    # mantissa bits make two kernels' rounding differences (batched verify against one-token decode)
    # 8x smaller, so fewer near-tied greedy choices flip (bf16 gave 93.5% equal outputs, every
    # divergence a near-tie); whether float16 reaches the 99% the greedy test asks is for the GPU to say.
    dtype: str = "float16"

    def key(self) -> str:
        blob = json.dumps({"v": GENERATOR_VERSION, "kind": "trained", **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def pairs(self) -> dict[str, tuple[str, str]]:
        return {k: v for k, v in TRAINED_PAIRS.items() if self.gpu_bound_layers or k == "trained"}

    def check(self) -> None:
        for layers in (self.small_layers, self.gpu_bound_layers):
            if layers and captured_layers(layers)[0] < self.trained_layers:
                raise TrainingError(
                    f"{self.trained_layers} trained layers: EAGLE-3's first capture (before layer 2) "
                    "would fall inside them, and the two targets would differ"
                )
            if layers and layers < 7:
                raise TrainingError(
                    f"a {layers}-layer target: EAGLE-3's captured layers (2, L/2, L-3) coincide below 7"
                )
        if self.prompt_candidates < self.prompt_count:
            raise TrainingError(
                f"{self.prompt_candidates} prompt candidates for {self.prompt_count} prompts: "
                "score at least as many as are kept"
            )
        if self.dtype not in ("float16", "bfloat16"):
            raise TrainingError(f"dtype {self.dtype!r}: the checkpoints are float16 or bfloat16 (what SGLang serves)")


def captured_layers(num_layers: int) -> list[int]:
    """The layers whose input SGLang's Llama captures for EAGLE-3 when the draft names none."""
    return [2, num_layers // 2, num_layers - 3]
