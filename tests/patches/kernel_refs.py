"""What every release line's CPU tests need the same way, whatever its SGLang: a word-level
tokenizer and sgl-kernel's greedy tree walk as a torch reference. Each line's harness binds the walk
to the argument names its release passes (`retrive_*` on 0.5.9 and 0.5.15's sgl_kernel,
`retrieve_*` on 0.5.23's verify_tree_greedy_func); the lines' conftest puts this folder on the path.
"""

from __future__ import annotations

from pathlib import Path


def word_tokenizer(path: Path, vocab_size: int):
    """A real transformers fast tokenizer through SGLang's get_tokenizer: token i is the word `w<i>`,
    EOS is `w2` (id 2), so a test writes stop strings as words and knows their token ids."""
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size)}
    model = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    model.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=model, eos_token="w2").save_pretrained(path)
    return get_tokenizer(str(path))


def greedy_tree_walk(
    predicts, accept_index, accept_token_num, candidates, index, next_token, next_sibling, target_predict
) -> None:
    # sgl-kernel's greedy tree walk: from the root, follow the child (then its siblings) whose
    # draft token equals the target's prediction at the last accepted node; write the target's
    # prediction at every accepted node and the bonus at the last one.
    flat_target = target_predict.reshape(-1)
    bs, steps = candidates.shape[0], accept_index.shape[1]
    for b in range(bs):
        last = int(index[b, 0])
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, steps):
            cur = int(next_token[b, cur])
            while cur != -1:
                if int(candidates[b, cur]) == int(flat_target[last]):
                    predicts[last] = flat_target[last]
                    accepted += 1
                    accept_index[b, accepted] = index[b, cur]
                    last = int(index[b, cur])
                    break
                cur = int(next_sibling[b, cur])
            if cur == -1:
                break
        accept_token_num[b] = accepted
        predicts[last] = flat_target[last]
