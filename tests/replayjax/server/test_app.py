"""The app in process (Starlette's TestClient) over a stub engine thread: a bug answers 500 in
OpenAI's error shape, unknown routes and methods answer in that shape too, and a draining server
refuses new requests with 503."""

import asyncio
import json

from starlette.testclient import TestClient

from replayjax.engine import Completion, Event
from replayjax.server.app import ServerState, create_app
from replayjax.server.metrics import Metrics
from replayjax.server.protocol import ServedModel
from replayjax.server.worker import EngineWorker, RequestFailed


class StubWorker:
    """Answers every request with its prompt reversed: its first token in one event (with the
    prompt tokens "cached", half of them), the rest with its completion in another; a prompt
    starting "!" fails, one starting "?" never completes."""
    failed = None

    def __init__(self, broken=False):
        self.broken = broken

    def load(self):
        if self.broken:
            raise RuntimeError("a bug")
        return 0, 0, 4

    def submit(self, request, deliver):
        if request.prompt[:1] == [ord("!")]:     # the engine could not serve this one
            deliver(RequestFailed("the prefill failed (RuntimeError: RESOURCE_EXHAUSTED)"))
            return
        tokens, cached = list(reversed(request.prompt))[:request.max_new_tokens], \
            len(request.prompt) // 2
        deliver(Event(request.id, tokens[:1], cached=cached))
        if request.prompt[:1] == [ord("?")]:     # still running until cancelled
            return
        deliver(Event(request.id, tokens[1:], Completion(request.id, tokens, "length", 0.0, 0.0,
                                                         cached_tokens=cached), cached))

    def cancel(self, request_id):
        pass


class ByteTokenizer:
    class _Enc:
        def __init__(self, ids):
            self.ids = ids

    def encode(self, text, add_special_tokens=True):
        return self._Enc(list(text.encode()))

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode(errors="replace")


def client(worker):
    served = ServedModel(name="stub", vocab=256, max_len=64, num_draft=0)
    state = ServerState(worker=worker, tokenizer=ByteTokenizer(), chat_template=None,
                        served=served, metrics=Metrics(worker.load, 0), max_queue=4)
    return TestClient(create_app(state), raise_server_exceptions=False), state


def error(resp, status):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and "Traceback" not in resp.text
    return err


def test_a_bug_answers_500_in_openai_shape():
    c, _ = client(StubWorker(broken=True))
    err = error(c.get("/health"), 500)
    assert err["type"] == "server_error" and "RuntimeError" in err["message"]


def test_unknown_routes_methods_and_missing_chat_template():
    c, _ = client(StubWorker())
    assert "Unknown endpoint" in error(c.get("/v1/nothing"), 404)["message"]
    assert "not allowed" in error(c.get("/v1/completions"), 405)["message"]
    err = error(c.post("/v1/chat/completions", json={
        "model": "stub", "messages": [{"role": "user", "content": "x"}]}), 400)
    assert "no chat template" in err["message"]


def test_a_request_the_engine_cannot_serve_is_500_and_the_rest_go_on():
    """An engine that fails one request (its prefill) and goes on: that request gets a 500
    naming why (or the stream's error event), counted as finish_reason "error"; the next is
    served and the server stays healthy."""
    c, state = client(StubWorker())
    body = {"model": "stub", "prompt": "!abc", "max_tokens": 2}
    err = error(c.post("/v1/completions", json=body), 500)
    assert (err["type"], err["code"]) == ("server_error", "request_failed")
    assert err["message"] == "the prefill failed (RuntimeError: RESOURCE_EXHAUSTED)"
    assert c.post("/v1/completions", json=dict(body, stream=True)).text == (
        'data: {"error":{"message":"the prefill failed (RuntimeError: RESOURCE_EXHAUSTED)",'
        '"type":"server_error","param":null,"code":"request_failed"}}\n\ndata: [DONE]\n\n')
    assert c.post("/v1/completions", json=dict(body, prompt="abc")).status_code == 200
    assert c.get("/health").status_code == 200
    assert 'replayjax_requests_total{finish_reason="error"} 2.0' in c.get("/metrics").text


def test_the_worker_hands_a_failed_request_its_error():
    """EngineWorker turns a completion with finish_reason "error" into a RequestFailed for
    that request's callback (the engine goes on)."""
    w, got = EngineWorker(engine=None), []
    w._sinks["x"] = got.append
    w._dispatch([Event("x", [], Completion("x", [], "error", float("nan"), 0.0, error="why"))])
    assert isinstance(got[0], RequestFailed) and str(got[0]) == "why" and not w._sinks


def test_served_then_503_while_draining():
    c, state = client(StubWorker())
    body = {"model": "stub", "prompt": "abc", "max_tokens": 2, "stop": "zz"}
    r = c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["choices"][0]["text"] == "cb" and out["usage"] == {
        "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 1}}
    asyncio.run(state.drain(timeout=0))
    err = error(c.post("/v1/completions", json=body), 503)
    assert err["code"] == "shutting_down"
    assert c.get("/health").status_code == 503


def test_prefix_cache_usage_and_metrics():
    """A completion's cached prompt tokens reach usage.prompt_tokens_details (also streamed)
    and the prefix-cache counters and hit rate at /metrics."""
    c, _ = client(StubWorker())
    body = {"model": "stub", "prompt": "abcd", "max_tokens": 2}
    assert c.post("/v1/completions", json=body).json()["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 2}
    r = c.post("/v1/completions", json=dict(body, prompt="abcdef", stream=True,
                                            stream_options={"include_usage": True}))
    assert '"prompt_tokens_details":{"cached_tokens":3}' in r.text
    # a stop string in its first tokens ends it before the engine's completion comes
    r = c.post("/v1/completions", json=dict(body, prompt="zyxwvu", stop="u")).json()
    assert r["choices"][0]["finish_reason"] == "stop"
    assert r["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}
    text = c.get("/metrics").text
    for line in ("replayjax_prefix_cache_lookup_tokens_total 16.0",
                 "replayjax_prefix_cache_hit_tokens_total 8.0",
                 "replayjax_prefix_cache_hit_rate 0.5"):
        assert line in text.splitlines(), line


def test_bodies_json_accepts_but_no_request_can_use_are_400():
    """A body nested past the JSON parser's depth limit, and strings with a lone surrogate
    escape (valid JSON, not Unicode: neither tokenizable nor writable in a response), in a
    value or a field name, answer 400 naming the field, never 500."""
    c, _ = client(StubWorker())
    post = lambda text: c.post("/v1/completions", content=text,
                               headers={"content-type": "application/json"})
    assert "nests too deeply" in error(post("[" * 100_000), 400)["message"]
    for body, param in (('{"model": "stub", "prompt": "a\\ud800b"}', "prompt"),
                        ('{"model": "\\udfff", "prompt": "ab"}', "model"),
                        ('{"model": "stub", "prompt": "ab", "stop": ["x", "\\ud800"]}', "stop"),
                        ('{"model": "stub", "prompt": "ab", "x\\ud800": 1}', None)):
        err = error(post(body), 400)
        assert err["param"] == param and "Unicode" in err["message"], err
    err = error(c.post("/v1/chat/completions", content='{"model": "stub", "messages": [{"role": '
                       '"user", "content": [{"type": "text", "text": "\\ud83d"}]}]}',
                       headers={"content-type": "application/json"}), 400)
    assert err["param"] == "messages"
    r = post('{"model": "stub", "prompt": "\\ud83d\\ude00", "max_tokens": 2}')   # a pair: fine
    assert r.status_code == 200, r.text


def test_bodies_past_the_limit_are_413_declared_or_streamed():
    """The server reads at most max_body_bytes of a body: past it, a 413 in OpenAI's shape,
    whether the client declared the length or streamed the body chunked; under it, served."""
    c, state = client(StubWorker())
    state.max_body_bytes = 1000
    big = '{"model": "stub", "prompt": "' + "a" * 2000 + '"}'
    headers = {"content-type": "application/json"}
    for content in (big, (big[i:i + 100].encode() for i in range(0, len(big), 100))):
        err = error(c.post("/v1/completions", content=content, headers=headers), 413)
        assert err["code"] == "request_too_large" and "1000 bytes" in err["message"]
    r = c.post("/v1/completions", content='{"model": "stub", "prompt": "ab", "max_tokens": 2}',
               headers=headers)
    assert r.status_code == 200, r.text


def test_prompt_lists_and_n_answer_every_choice_in_order():
    """Two prompts x n = 2: four choices, index i n + j, each its prompt's answer; usage counts
    each prompt (and its cached tokens) once and every choice's completion; a stream
    interleaves the choices' chunks, each naming its index, and ends each with its finish
    reason, then the usage."""
    c, state = client(StubWorker())
    body = {"model": "stub", "prompt": ["abc", "de"], "n": 2, "max_tokens": 2}
    r = c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert [(ch["index"], ch["text"], ch["finish_reason"]) for ch in out["choices"]] == [
        (0, "cb", "length"), (1, "cb", "length"), (2, "ed", "length"), (3, "ed", "length")]
    assert out["usage"] == {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13,
                            "prompt_tokens_details": {"cached_tokens": 2}}
    r = c.post("/v1/completions", json=dict(body, stream=True,
                                            stream_options={"include_usage": True}))
    events = [json.loads(line[6:]) for line in r.text.split("\n\n") if line.startswith(
        "data: {")]
    texts, reasons = {}, {}
    for e in events[:-1]:
        [ch] = e["choices"]
        texts[ch["index"]] = texts.get(ch["index"], "") + ch["text"]
        if ch["finish_reason"]:
            reasons[ch["index"]] = ch["finish_reason"]
    assert texts == {0: "cb", 1: "cb", 2: "ed", 3: "ed"} and set(reasons.values()) == {"length"}
    assert events[-1]["choices"] == [] and events[-1]["usage"] == out["usage"]
    assert r.text.endswith("data: [DONE]\n\n") and not state.live
    chat = {"model": "stub", "messages": [{"role": "user", "content": "x"}], "n": 2}
    state.chat_template = type("T", (), {"render": lambda self, m, kw: "hi"})()
    out = c.post("/v1/chat/completions", json=chat).json()
    assert [(ch["index"], ch["message"]["content"]) for ch in out["choices"]] == [
        (0, "ih"), (1, "ih")]


def test_choices_are_admitted_all_or_none():
    """More choices than the slots and the queue hold together: 400 (retrying cannot help);
    more than the queue has room for now: 429; a choice the engine fails fails the request
    and cancels its other choices."""
    c, state = client(StubWorker())        # 4 slots, a queue of 4
    body = {"model": "stub", "prompt": "abc", "max_tokens": 2}
    err = error(c.post("/v1/completions", json=dict(body, n=9)), 400)
    assert (err["code"], err["param"]) == ("too_many_choices", "n") and "9 choices" in \
        err["message"]
    assert len(c.post("/v1/completions", json=dict(body, n=8)).json()["choices"]) == 8
    state.live.update(object() for _ in range(6))          # 2 waiting
    assert c.post("/v1/completions", json=dict(body, n=2)).status_code == 200
    assert error(c.post("/v1/completions", json=dict(body, n=3)), 429)["code"] == "queue_full"
    state.live.clear()
    cancelled = []
    state.worker.cancel = cancelled.append
    err = error(c.post("/v1/completions", json=dict(body, prompt=["?ab", "!x"])), 500)
    assert err["code"] == "request_failed" and not state.live
    assert [rid[-2:] for rid in cancelled] == ["-0"]
