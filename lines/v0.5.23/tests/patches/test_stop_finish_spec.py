"""Finishing a request on tokens accepted several per step, as 0.5.23's output processor calls
`Req.update_finish_state(new_accepted_len)` for a speculative step, against the same tokens decoded
one per step (what a plain server does). Upstream 0.5.23 does this but for an EOS before a stop
string in one step, which the line's 0004 fixes; the test pins both.

The two must agree on where the request ends and why: `finished_len`, which trims the returned ids
(`output_ids_through_stop`) and `completion_tokens`, and `finished_reason`.
"""

from __future__ import annotations

import pytest
from verify_cpu import word_tokenizer

from sglang_cpu import make_req, make_server_args, write_tiny_llama_config

EOS = 2


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    make_server_args(write_tiny_llama_config(tmp_path_factory.mktemp("model")))
    return word_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def _req(tokenizer, rid: str, max_new_tokens: int = 64, stop_token_ids=None, **sampling):
    return make_req(
        rid, 3, max_new_tokens=max_new_tokens, stop_token_ids=stop_token_ids,
        sampling={"temperature": 0.0, **sampling}, tokenizer=tokenizer,
    )  # fmt: skip


def _one_per_step(req, tokens):
    for token in tokens:
        req.output_ids.append(token)
        req.update_finish_state()
        if req.finished():
            return


def _accepted_per_step(req, tokens, accept_lens):
    start = 0
    for n in accept_lens:
        req.output_ids.extend(tokens[start : start + n])
        start += n
        req.update_finish_state(n)
        if req.finished():
            return


def _ending(req):
    reason = req.finished_reason.to_json() if req.finished_reason else None
    return list(req.output_ids_through_stop), reason


def w(*ids: int) -> str:
    return " ".join(f"w{i}" for i in ids)


# (sampling params, output tokens, accepted tokens per step)
CASES = {
    # A one-token stop string completed by the first of four tokens accepted together.
    "stop-in-first-accepted": ({"stop": w(77)}, [77, 30, 31, 32, 33], [4, 1]),
    # A two-token stop string split across two steps.
    "stop-across-steps": ({"stop": w(77, 78)}, [40, 41, 77, 78, 42, 43, 44], [3, 4]),
    # A two-token stop string in the middle of one step's tokens.
    "stop-mid-step": ({"stop": w(77, 78)}, [40, 77, 78, 42, 43, 44], [1, 4, 1]),
    # A regex stop in the middle of one step's tokens.
    "regex-mid-step": ({"stop_regex": r"w9\d"}, [40, 41, 93, 42, 43], [1, 4]),
    # A stop string before the length limit, both inside one step.
    "stop-before-length": ({"stop": w(77), "max_new_tokens": 4}, [40, 77, 41, 42], [4]),
    # EOS inside one step, with a stop string after it in the same step: 0.5.23 checks stop
    # strings first and ends the request at the stop string, past the EOS a plain server ends at.
    # Upstream ends it at the stop string after the EOS (the line's 0004 fixes it).
    "eos-before-stop": ({"stop": w(77)}, [40, EOS, 77, 41], [4]),
    # A stop token id inside one step.
    "stop-token-id": ({"stop_token_ids": [55]}, [40, 41, 55, 42], [4]),
    # No stop: the length limit inside one step.
    "length-mid-step": ({"max_new_tokens": 3}, [40, 41, 42, 43], [4]),
}


@pytest.mark.parametrize("sampling, tokens, accept_lens", CASES.values(), ids=list(CASES))
def test_accepted_tokens_finish_where_one_per_step_does(tokenizer, sampling, tokens, accept_lens):
    plain = _req(tokenizer, "plain", **sampling)
    _one_per_step(plain, tokens)
    spec = _req(tokenizer, "spec", **sampling)
    _accepted_per_step(spec, tokens, accept_lens)

    assert plain.finished(), "the case must finish the request"
    assert _ending(spec) == _ending(plain)


def test_unfinished_request_keeps_every_accepted_token(tokenizer):
    spec = _req(tokenizer, "spec", stop=w(77, 78))
    # Ends in the stop string's first token: not a stop yet, nothing trimmed.
    _accepted_per_step(spec, [40, 41, 42, 77], [4])
    assert not spec.finished()
    assert list(spec.output_ids_through_stop) == [40, 41, 42, 77]
