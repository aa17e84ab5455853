"""Log probabilities over HTTP: the request fields checked against the server's --max-logprobs,
the engine's per-token values in OpenAI's chat and legacy completion shapes (validated by the
`openai` package's models), whole and streamed alike, cut with the text at a stop string."""

import json
import math

import openai.types as ot
import openai.types.chat as oa
import pytest
from starlette.testclient import TestClient

from replayjax.sampling import SamplingParams
from replayjax.server import protocol as P
from replayjax.server.app import ServerState, create_app
from replayjax.server.chat import ChatTemplate
from replayjax.server.metrics import Metrics
from tests.replayjax.server.test_app import ByteTokenizer
from tests.replayjax.server.test_tools import ScriptWorker

SERVED = P.ServedModel(name="m", vocab=256, max_len=256, num_draft=0,
                       defaults=SamplingParams(temperature=0.0), max_logprobs=5)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "x"}]}


def _render(messages, kwargs):
    return "".join(m["content"] for m in messages)


def _encode(text):
    return list(text.encode())


@pytest.mark.parametrize("body,chat,want", [
    ({"logprobs": 3}, False, 3), ({"logprobs": 0}, False, 0), ({}, False, None),
    ({"logprobs": True, "top_logprobs": 2}, True, 2), ({"logprobs": True}, True, 0),
    ({"logprobs": False}, True, None), ({}, True, None),
])
def test_requests_ask_for_alternatives(body, chat, want):
    if chat:
        [p] = P.parse_chat({**CHAT, **body}, SERVED, _render, _encode)
    else:
        [p] = P.parse_completion({"model": "m", "prompt": "x", **body}, SERVED, _encode)
    assert p.logprobs == want


@pytest.mark.parametrize("body,chat,served,param,code", [
    ({"logprobs": 6}, False, SERVED, "logprobs", None),                   # past --max-logprobs
    ({"logprobs": 21}, False, SERVED, "logprobs", None),
    ({"logprobs": True}, False, SERVED, "logprobs", None),               # an integer there
    ({"logprobs": 1}, True, SERVED, "logprobs", None),                   # a boolean here
    ({"top_logprobs": 2}, True, SERVED, "top_logprobs", None),           # needs logprobs true
    ({"logprobs": True, "top_logprobs": 6}, True, SERVED, "top_logprobs", None),
    ({"logprobs": True, "top_logprobs": 21}, True, SERVED, "top_logprobs", None),
    ({"logprobs": 2}, False, SERVED.__class__(name="m", vocab=256, max_len=256, num_draft=0),
     "logprobs", "unsupported_parameter"),                               # no --max-logprobs
])
def test_bad_requests_are_named(body, chat, served, param, code):
    with pytest.raises(P.ApiError) as e:
        if chat:
            P.parse_chat({**CHAT, **body}, served, _render, _encode)
        else:
            P.parse_completion({"model": "m", "prompt": "x", **body}, served, _encode)
    assert (e.value.status, e.value.param, e.value.code) == (400, param, code)


ENTRIES = [(ord("a"), -0.5, ((ord("a"), -0.5), (ord("b"), -1.5), (ord("c"), -2.0))),
           (ord("b"), -1.0, ((ord("a"), -0.75), (ord("b"), -1.0), (ord("c"), -math.inf)))]


def test_the_shapes():
    spell = chr
    got = P.chat_logprobs(ENTRIES, spell, 2)
    assert got["content"][0] == {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": [
        {"token": "a", "logprob": -0.5, "bytes": [97]},
        {"token": "b", "logprob": -1.5, "bytes": [98]}]}
    assert [c["top_logprobs"] for c in P.chat_logprobs(ENTRIES, spell, 0)["content"]] == [[], []]
    got = P.completion_logprobs(ENTRIES, spell, 3, offset=4)
    assert got == {"tokens": ["a", "b"], "token_logprobs": [-0.5, -1.0],
                   "top_logprobs": [{"a": -0.5, "b": -1.5, "c": -2.0},
                                    {"a": -0.75, "b": -1.0, "c": -9999.0}],   # JSON has no -inf
                   "text_offset": [4, 5]}
    # with no alternatives the sampled token is still listed (OpenAI's logprobs + 1 rule)
    assert P.completion_logprobs(ENTRIES, spell, 0)["top_logprobs"] == [{"a": -0.5},
                                                                       {"b": -1.0}]


def _logprob(t):
    """Token t's logprob -t / 100 and its alternatives t, t + 1, ... at -t / 100 - j."""
    return -t / 100, tuple((t + j, -t / 100 - j) for j in range(5))


def _client(reply):
    worker = ScriptWorker(reply, "length", _logprob)
    state = ServerState(worker=worker, tokenizer=ByteTokenizer(),
                        chat_template=ChatTemplate("{{ messages[0].content }}", {}),
                        served=SERVED, metrics=Metrics(worker.load, 0), max_queue=4)
    return TestClient(create_app(state))


def _events(r):
    return [json.loads(e[len("data: "):]) for e in r.text.split("\n\n")
            if e and e != "data: [DONE]"]


def test_chat_logprobs_whole_and_streamed():
    c = _client("hey")
    body = {**CHAT, "logprobs": True, "top_logprobs": 2, "max_tokens": 10}
    out = c.post("/v1/chat/completions", json=body).json()
    lp = oa.ChatCompletion.model_validate(out).choices[0].logprobs
    assert [(t.token, t.logprob) for t in lp.content] == [("h", -1.04), ("e", -1.01),
                                                          ("y", -1.21)]
    assert [[a.token for a in t.top_logprobs] for t in lp.content] == [
        ["h", "i"], ["e", "f"], ["y", "z"]]
    streamed = []
    for e in _events(c.post("/v1/chat/completions", json={**body, "stream": True})):
        oa.ChatCompletionChunk.model_validate(e)
        for ch in e["choices"]:
            streamed += (ch["logprobs"] or {}).get("content", [])
    assert streamed == out["choices"][0]["logprobs"]["content"]
    # none asked: none given
    out = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 10}).json()
    assert out["choices"][0]["logprobs"] is None


def test_completion_logprobs_whole_streamed_and_cut_at_a_stop():
    c = _client("abcd")
    body = {"model": "m", "prompt": "x", "logprobs": 2, "max_tokens": 10}
    out = c.post("/v1/completions", json=body).json()
    lp = ot.Completion.model_validate(out).choices[0].logprobs
    assert lp.tokens == list("abcd") and lp.text_offset == [0, 1, 2, 3]
    assert lp.top_logprobs[0] == {"a": -0.97, "b": -1.97}
    got = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in _events(c.post("/v1/completions", json={**body, "stream": True})):
        for ch in e["choices"]:     # (openai's Completion type wants a finish reason in each)
            ot.CompletionChoice.model_validate({**ch, "finish_reason": "length"})
            for k, v in (ch["logprobs"] or {}).items():
                got[k] += v
    assert got == out["choices"][0]["logprobs"]
    # a stop string: the text ends before it, the tokens up to the one that completed it
    out = c.post("/v1/completions", json={**body, "stop": "c"}).json()
    assert out["choices"][0]["text"] == "ab"
    assert out["choices"][0]["logprobs"]["tokens"] == ["a", "b", "c"]
    assert out["usage"]["completion_tokens"] == 3
