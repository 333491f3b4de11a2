"""Stop conditions inside the tokens one speculative step accepts (v0.5.15 line, upstream's own
behaviour): the request ends at the stop, with the ids and reason a plain decode gives.

The v0.5.9 line needed a patch for this (its 0011, upstream since v0.5.14); 0.5.15 has most of it
and this line's 0005 the rest (a stop before the length limit, an EOS before a stop string, within
one step). Real prefills, EAGLEWorkerV2's verify
on chains the target accepts as far as the test plans, and the scheduler's own output processor
(process_batch_result_decode, which calls Req.update_finish_state with the step's accept length);
the reference is the same tokens fed to a Req one at a time, as a plain server does.
"""

from __future__ import annotations

import pytest
from spec_v2_cpu import spec_v2_server

from sglang_cpu import make_req

EOS = 2
FILLER = 99  # a draft token the target never picks


@pytest.fixture
def env(tmp_path, monkeypatch):
    return spec_v2_server(tmp_path, monkeypatch)


def w(*ids: int) -> str:
    return " ".join(f"w{i}" for i in ids)


def _ending(req):
    reason = req.finished_reason.to_json() if req.finished_reason else None
    return list(req.output_ids_through_stop), reason


def _req(env, rid, sampling):
    sampling = {"temperature": 0.0, "max_new_tokens": 64, **sampling}
    limits = {"max_new_tokens": sampling.pop("max_new_tokens"), "stop_token_ids": sampling.pop("stop_token_ids", None)}
    return make_req(rid, 6, sampling=sampling, tokenizer=env.tokenizer, **limits)


def _plain(env, sampling, tokens):
    req = _req(env, "plain", sampling)
    for token in tokens:
        req.output_ids.append(token)
        req.update_finish_state()
        if req.finished():
            break
    return req


def _speculative(env, sampling, first, steps):
    """The prefill emits `first`; then each step accepts its list (drafts, then the bonus)."""
    loop, model = env.loop, env.model
    req = _req(env, "spec", sampling)
    model.plan = lambda fb: [first]
    batch = loop.prefill([req])
    for step in steps:
        batch.filter_batch()  # update_running_batch drops what has finished
        if batch.is_empty():
            break
        loop.prepare_decode(batch)
        env.draft.draft_tokens = [step[:-1] + [FILLER] * (4 - len(step))]
        model.plan = lambda fb, s=step: s + [1] * (4 - len(s))
        loop.run(batch)  # and the previous batch's output, as the overlap loop orders it
    loop.flush()
    return req


# (sampling params, the prefill's token, the tokens each speculative step accepts)
CASES = {
    "stop-in-first-accepted": ({"stop": w(77)}, 40, [[77, 30, 31, 32], [33]]),
    "stop-across-steps": ({"stop": w(77, 78)}, 40, [[41, 77], [78, 42, 43, 44]]),
    "stop-mid-step": ({"stop": w(77, 78)}, 40, [[77, 78, 42, 43], [44]]),
    "regex-mid-step": ({"stop_regex": r"w9\d"}, 40, [[41, 93, 42, 43]]),
    # Upstream's Req.update_finish_state checks the length first and stop strings before stop
    # tokens, each over the whole step: unpatched, the first ends at the limit with the tokens
    # after its stop string, the second at the stop string after the EOS (0005 fixes both).
    "stop-before-length": ({"stop": w(77), "max_new_tokens": 5}, 40, [[41, 77, 42, 43]]),
    "eos-before-stop": ({"stop": w(77)}, 40, [[41, EOS, 77, 42]]),
    "stop-token-id": ({"stop_token_ids": [55]}, 40, [[41, 55, 42, 43]]),
    "length-mid-step": ({"max_new_tokens": 3}, 40, [[41, 42, 43, 44]]),
}


@pytest.mark.parametrize("sampling, first, steps", CASES.values(), ids=CASES.keys())
def test_accepted_tokens_finish_where_one_per_step_does(env, sampling, first, steps):
    spec = _speculative(env, sampling, first, steps)
    plain = _plain(env, sampling, [first] + [t for step in steps for t in step])

    assert plain.finished(), "the case must finish the request"
    assert spec.finished() and _ending(spec) == _ending(plain)
    assert len(spec.output_ids_through_stop) < 1 + sum(len(s) for s in steps)  # it ends inside a step


def test_unfinished_request_keeps_every_accepted_token(env):
    # Ends in the stop string's first token: not a stop yet, nothing trimmed.
    spec = _speculative(env, {"stop": w(77, 78)}, 40, [[41, 42, 77]])
    assert not spec.finished()
    assert list(spec.output_ids_through_stop) == [40, 41, 42, 77]
