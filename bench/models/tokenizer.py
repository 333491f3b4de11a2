"""The BPE tokenizer every fixture set shares: trained with `tokenizers` on text made here from a
seed (the benchmark's prompts and code-like lines), saved as a transformers fast tokenizer beside
each model, where SGLang loads it from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def tokenizer_text(seed: int, n_lines: int = 6000) -> list[str]:
    """Deterministic text for the tokenizer: the bench prompts plus code-like synthetic lines."""
    import random

    rng = random.Random(seed)
    lines: list[str] = []
    prompts = Path(__file__).parents[1] / "data" / "coding_prompts.jsonl"
    if prompts.is_file():
        for raw in prompts.read_text(encoding="utf-8").splitlines():
            if raw.strip():
                lines.append(json.loads(raw)["prompt"])
    words = (
        "def class return import from self if else elif for while in not and or None True False "
        "try except finally with as lambda yield async await print len range list dict set str int "
        "float open read write file path json http request response server client error value key "
        "test assert function call tool result query index token batch cache model draft target "
        "the a an of to is are was be this that it on at by we you they please write code fix bug"
    ).split()
    punct = ["(", ")", ":", ",", ".", "=", "==", "+", "-", "*", "/", "[", "]", "{", "}", "\n", "    "]
    for _ in range(n_lines):
        n = rng.randint(4, 24)
        parts = []
        for _ in range(n):
            r = rng.random()
            if r < 0.7:
                parts.append(rng.choice(words))
            elif r < 0.9:
                parts.append(rng.choice(punct))
            else:
                parts.append(str(rng.randint(0, 999)))
        lines.append(" ".join(parts))
    return lines


SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2; extra special tokens follow from 3


def build_tokenizer(out: Path, vocab: int, lines: list[str], extra_special: list[str] | None = None) -> int:
    """Train a byte-level BPE tokenizer on lines, save it as a transformers fast tokenizer; return its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL_TOKENS + list(extra_special or []),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = (
        "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    fast.save_pretrained(str(out))
    return len(fast)


def copy_tokenizer(tokdir: Path, root: Path, pairs: dict[str, tuple[str, str]]) -> None:
    """Put the tokenizer beside every model of the pairs (SGLang loads it from the model's folder)."""
    for name in {n for pair in pairs.values() for n in pair}:
        for f in tokdir.iterdir():
            shutil.copy2(f, root / name / f.name)
