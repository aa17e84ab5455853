"""`replayjax serve` of the demo model in a subprocess on 127.0.0.1 (the session's `demo_server`),
driven by the official `openai` client and by httpx: completions, chat and streaming; 32
concurrent streams give `replayjax generate`'s greedy outputs; a client that goes away frees its
slot; every bad request gets its 4xx in OpenAI's shape and the next request is served; a soak of
500 requests with random arrivals and cancellations loses nothing and leaks no slot."""

import asyncio
import json
import math
import random
import subprocess
import sys
import time

import httpx
import openai
import pytest

from tests.replayjax.server.helpers import (
    ENGINE_FLAGS,
    MAX_LEN,
    MODEL,
    REPO,
    env,
    metric,
    sse_events,
)

# 32 prompts of at most 16 bytes (one prefill length bucket), licence-like
WORDS = ["This program", "You should", "GNU General", "the License", "Copyright", "Public",
         "free software", "WITHOUT ANY", "warranty", "the terms", "distribute", "modify it"]
PROMPTS = [f"{a} {b}"[:16] for a in WORDS[:8] for b in ("is", "of")] + \
          [f"{w}, "[:16] for w in WORDS] + ["Licensor ", "Section 1", "The ", "Each "]
assert len(PROMPTS) == 32 and all(len(p) <= 16 for p in PROMPTS)
N_NEW = 24


@pytest.fixture(scope="module")
def server(demo_server):
    yield demo_server
    assert demo_server.proc.poll() is None, demo_server.stderr()[-2000:]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(jax_cache):
    """`replayjax generate`'s greedy texts of PROMPTS (N_NEW tokens each), same engine shape."""
    cmd = [sys.executable, "-m", "replayjax.cli", "generate", "--max-new-tokens", str(N_NEW),
           "--json", *ENGINE_FLAGS]
    for p in PROMPTS:
        cmd += ["--prompt", p]
    out = subprocess.run(cmd, cwd=REPO, env=env(jax_cache), capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return {p: r["text"] for p, r in zip(PROMPTS, json.loads(out.stdout)["results"])}


def wait_idle(server, timeout=30.0):
    """The server's health once nothing is queued, running or in flight."""
    deadline = time.monotonic() + timeout
    while True:
        h = server.health()
        if (h["queued"], h["running"], h["in_flight"]) == (0, 0, 0) or \
                time.monotonic() > deadline:
            return h
        time.sleep(0.05)


# ---------------------------------------------------------------------- the openai client

def test_tools_on_the_demo_model_are_a_clear_400(client):
    """The demo's chat template renders no tools: a request with tools is refused, naming the
    way to serve them (tool_choice "none" renders none, so it is served)."""
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    msgs = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError, match="--tool-call-format") as e:
        client.chat.completions.create(model=MODEL, messages=msgs, tools=[weather],
                                       max_tokens=2)
    assert e.value.body["param"] == "tools"
    out = client.chat.completions.create(model=MODEL, messages=msgs, tools=[weather],
                                         tool_choice="none", max_tokens=2)
    assert out.choices[0].message.tool_calls is None and out.choices[0].message.content


def test_logprobs_of_greedy_tokens(client):
    """The demo server runs with --max-logprobs 5: a greedy token is its own most likely
    alternative, every logprob is <= 0 and the alternatives' probabilities sum to <= 1, in
    both shapes."""
    out = client.completions.create(model=MODEL, prompt="This program", max_tokens=8,
                                    temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == out.usage.completion_tokens == 8
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert value <= 0 and max(top.values()) == value and top[token] == value
        assert len(top) == 3 and sum(math.exp(v) for v in top.values()) <= 1 + 1e-6
    assert lp.text_offset[0] == 0 and "".join(lp.tokens) == out.choices[0].text
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Quote the GPL."}], max_tokens=6,
        temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens == 6
    assert all(t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob
               and len(t.top_logprobs) == 2 for t in content)
    with pytest.raises(openai.BadRequestError, match="at most 5 alternatives"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=1, logprobs=6)


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError, match="The model 'gpt-4' does not exist"):
        client.models.retrieve("gpt-4")
    h = server.health()
    assert h["status"] == "ok" and h["slots"] == 32


def test_completion_greedy_matches_generate(client, reference):
    p = PROMPTS[0]
    r = client.completions.create(model=MODEL, prompt=p, max_tokens=N_NEW, temperature=0)
    c = r.choices[0]
    assert c.text == reference[p] and c.finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
        len(p.encode()), N_NEW, len(p.encode()) + N_NEW)
    assert r.object == "text_completion" and r.model == MODEL and r.id.startswith("cmpl-")
    ids = client.completions.create(model=MODEL, prompt=list(p.encode()), max_tokens=N_NEW,
                                    temperature=0)
    assert ids.choices[0].text == reference[p]


def test_completion_stream_with_usage(client, reference):
    p = PROMPTS[1]
    chunks = list(client.completions.create(model=MODEL, prompt=p, max_tokens=N_NEW,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == reference[p]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == N_NEW
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_and_chat_stream(client):
    msgs = [{"role": "system", "content": "Licence texts."},
            {"role": "user", "content": "Quote the GPL."}]
    rendered = "System: Licence texts.\nUser: Quote the GPL.\nAssistant:"
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16,
                                       temperature=0)
    m = r.choices[0].message
    assert m.role == "assistant" and len(m.content) == 16
    assert r.usage.prompt_tokens == len(rendered) and r.object == "chat.completion"
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=msgs, max_completion_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == m.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.total_tokens == len(rendered) + 16


def test_stop_strings_and_stop_token_ids(client, reference):
    p = PROMPTS[2]
    text = reference[p]
    stop = text[6:9]
    cut = text.index(stop)
    r = client.completions.create(model=MODEL, prompt=p, max_tokens=N_NEW, temperature=0,
                                  stop=[stop, "\x01never"])
    assert r.choices[0].text == text[:cut] and r.choices[0].finish_reason == "stop"
    assert cut < r.usage.completion_tokens < N_NEW
    streamed = client.completions.create(model=MODEL, prompt=p, max_tokens=N_NEW, temperature=0,
                                         stop=stop, stream=True)
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks) == text[:cut]   # no part of the stop
    assert chunks[-1].choices[0].finish_reason == "stop"
    tok = text[4]
    r = client.completions.create(model=MODEL, prompt=p, max_tokens=N_NEW, temperature=0,
                                  extra_body={"stop_token_ids": [ord(tok)]})
    assert r.choices[0].text == text[:text.index(tok) + 1]
    assert r.choices[0].finish_reason == "stop"


def test_sampling_is_seeded_and_max_tokens_defaults_as_openais(client):
    kw = dict(model=MODEL, prompt=PROMPTS[3], max_tokens=12, temperature=0.9, top_p=0.95)
    a, b = (client.completions.create(seed=11, extra_body={"top_k": 40}, **kw) for _ in "ab")
    assert a.choices[0].text == b.choices[0].text and a.usage.completion_tokens == 12
    # without max_tokens: 16 tokens for a completion, the rest of the context for a chat
    r = client.completions.create(model=MODEL, prompt=PROMPTS[3], temperature=0)
    assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length"
    r = client.chat.completions.create(model=MODEL, temperature=0,
                                       messages=[{"role": "user", "content": PROMPTS[3]}])
    assert (r.usage.prompt_tokens + r.usage.completion_tokens == MAX_LEN
            or r.choices[0].finish_reason == "stop")
    assert r.usage.completion_tokens > 16


def test_prompt_lists_and_n_through_the_client(client, reference):
    """A list of prompts with n = 2 (greedy: both choices of a prompt are its text), a
    one-element list as LangChain sends it, and n streamed: every choice's text by index."""
    r = client.completions.create(model=MODEL, prompt=PROMPTS[:2], n=2, max_tokens=N_NEW,
                                  temperature=0)
    assert [(c.index, c.text) for c in r.choices] == [
        (i, reference[PROMPTS[i // 2]]) for i in range(4)]
    assert r.usage.prompt_tokens == sum(len(p.encode()) for p in PROMPTS[:2])
    assert r.usage.completion_tokens == 4 * N_NEW
    one = client.completions.create(model=MODEL, prompt=[PROMPTS[0]], max_tokens=N_NEW,
                                    temperature=0)
    assert [c.text for c in one.choices] == [reference[PROMPTS[0]]]
    texts = {}
    for chunk in client.completions.create(model=MODEL, prompt=PROMPTS[1], n=3,
                                           max_tokens=N_NEW, temperature=0, stream=True):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {i: reference[PROMPTS[1]] for i in range(3)}


def test_refusals_through_the_client(client):
    with pytest.raises(openai.BadRequestError, match="only 1"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=2, best_of=2)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)


# ---------------------------------------------------------------------- concurrency

def test_32_concurrent_streams_match_generate(server, reference):
    async def one(c, p):
        stream = await c.completions.create(model=MODEL, prompt=p, max_tokens=N_NEW,
                                            temperature=0, stream=True)
        return "".join([ch.choices[0].text async for ch in stream])

    async def run():
        c = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        async with c:
            return await asyncio.gather(*(one(c, p) for p in PROMPTS))

    texts = asyncio.run(run())
    assert dict(zip(PROMPTS, texts)) == reference
    assert wait_idle(server)["running"] == 0


def _load(server):
    return httpx.get(f"{server.url}/metrics", timeout=30).text


def test_a_client_that_goes_away_frees_its_slot(server):
    body = {"model": MODEL, "prompt": PROMPTS[4], "max_tokens": 200, "temperature": 0}
    before = metric(_load(server), "replayjax_requests_total", 'finish_reason="cancelled"')
    with httpx.Client(base_url=server.url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            lines = r.iter_lines()
            assert sse_events([next(lines)])[0]["choices"][0]["text"]
            h = server.health()
            assert (h["running"], h["in_flight"]) == (1, 1)
            assert metric(_load(server), "replayjax_running_slots") == 1
        # non-streaming: the client gives up waiting
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/completions", json=body, timeout=0.3)
    h = wait_idle(server, timeout=10)
    assert (h["running"], h["queued"], h["in_flight"]) == (0, 0, 0)
    text = _load(server)
    assert metric(text, "replayjax_running_slots") == 0
    assert metric(text, "replayjax_requests_total", 'finish_reason="cancelled"') == before + 2


# ---------------------------------------------------------------------- bad requests

BAD = [  # (method, path, body or raw bytes, status, param)
    ("POST", "/v1/completions", b'{"model": ', 400, None),
    ("POST", "/v1/completions", b"\xff\xfe", 400, None),
    ("POST", "/v1/completions", [1, 2], 400, None),
    ("POST", "/v1/completions", {"prompt": "x"}, 400, "model"),
    ("POST", "/v1/completions", {"model": "nope", "prompt": "x"}, 404, "model"),
    ("POST", "/v1/completions", {"model": MODEL}, 400, "prompt"),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": {"a": 1}}, 400, "prompt"),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": [1, 300]}, 400, "prompt"),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": [0] * (MAX_LEN + 1)}, 400, "prompt"),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": MAX_LEN}, 400,
     "max_tokens"),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": -1}, 400,
     "max_tokens"),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "temperature": "hot"}, 400,
     "temperature"),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 7}, 400, "top_p"),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "top_k": 0.5}, 400, "top_k"),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "seed": "s"}, 400, "seed"),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "stop": [1]}, 400, "stop"),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "stop_token_ids": [-3]}, 400,
     "stop_token_ids"),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "n": 0}, 400, "n"),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "bogus": 1}, 400, "bogus"),
    ("POST", "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user"}]}, 400,
     "messages[0].content"),
    ("POST", "/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
    ("POST", "/v1/chat/completions", {"model": MODEL, "prompt": "x"}, 400, "prompt"),
    ("GET", "/v1/chat/completions", None, 405, None),
    ("GET", "/v2/anything", None, 404, None),
]


def test_bad_requests_get_4xx_and_the_server_keeps_serving(server, reference):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for method, path, body, status, param in BAD:
            kw = {"content": body} if isinstance(body, bytes) else \
                {"json": body} if body is not None else {}
            r = http.request(method, path, **kw)
            assert r.status_code == status, (body, r.text)
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"}, r.text
            assert err["param"] == param and err["message"] and "Traceback" not in r.text
        r = http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPTS[5],
                                               "max_tokens": N_NEW, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == reference[PROMPTS[5]]
    text = _load(server)
    assert metric(text, "replayjax_rejected_requests_total", 'reason="model_not_found"') >= 1
    assert server.health()["status"] == "ok"


# ---------------------------------------------------------------------- soak

def test_soak_500_requests_random_arrivals_and_cancellations(server):
    """500 requests over ~10 s (streaming or not, greedy or sampled, 1..N_NEW tokens); a fifth
    are cancelled by their client at a random moment (within 0.2 s: most before they finish,
    even on a fast machine). Every other one returns all its tokens, and afterwards no slot,
    queue entry or request is left. (Greedy texts are not compared with `generate`'s here: a
    prompt prefilled beside longer ones pads to a longer bucket and may round a near-tie the
    other way; the 32-stream test checks equality where every request arrives at once.)"""
    rng = random.Random(1)
    plan = [dict(prompt=rng.choice(PROMPTS), n=rng.randint(1, N_NEW), stream=rng.random() < 0.5,
                 sampled=rng.random() < 0.2, at=rng.uniform(0, 10),
                 cancel=rng.uniform(0, 0.2) if rng.random() < 0.2 else None)
            for _ in range(500)]

    async def one(http, i, p):
        await asyncio.sleep(p["at"])
        body = {"model": MODEL, "prompt": p["prompt"], "max_tokens": p["n"],
                "temperature": 0.8 if p["sampled"] else 0, "seed": i, "stream": p["stream"]}

        async def request():
            if not p["stream"]:
                r = await http.post("/v1/completions", json=body)
                assert r.status_code == 200, r.text
                out = r.json()
                return out["choices"][0]["text"], out["choices"][0]["finish_reason"], \
                    out["usage"]["completion_tokens"]
            body["stream_options"] = {"include_usage": True}
            async with http.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                events = sse_events([line async for line in r.aiter_lines()])
            assert events[-1] == "[DONE]"
            chunks = [e for e in events[:-1] if e["choices"]]
            return ("".join(c["choices"][0]["text"] for c in chunks),
                    chunks[-1]["choices"][0]["finish_reason"],
                    events[-2]["usage"]["completion_tokens"])

        if p["cancel"] is None:
            return await request()
        try:
            return await asyncio.wait_for(request(), p["cancel"])
        except TimeoutError:
            return None

    async def run():
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as http:
            return await asyncio.gather(*(one(http, i, p) for i, p in enumerate(plan)))

    before = metric(_load(server), "replayjax_requests_total", 'finish_reason="length"')
    results = asyncio.run(run())
    completed = [res for res in results if res is not None]
    assert len(completed) >= sum(p["cancel"] is None for p in plan)
    assert len(completed) <= len(plan) - 40                         # many were cancelled
    for p, res in zip(plan, results):
        if res is None:
            continue
        text, reason, n = res
        assert (reason, n) == ("length", p["n"]), (p, res)
    h = wait_idle(server)
    assert (h["queued"], h["running"], h["in_flight"]) == (0, 0, 0)
    done = metric(_load(server), "replayjax_requests_total", 'finish_reason="length"') - before
    assert done >= len(completed)
