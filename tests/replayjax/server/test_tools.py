"""Tool calls in chat (`replayjax.server.tools`): the request's tools checked and rendered, a
reply read in each tool-call format (whole and streamed: every split of the text gives the same
calls), and the answers in OpenAI's shapes (validated by the `openai` package's own models)."""

import itertools
import json

import openai.types.chat as oa
import pytest
from starlette.testclient import TestClient

from replayjax.engine import Completion, Event
from replayjax.sampling import SamplingParams
from replayjax.server import tools as T
from replayjax.server.app import ServerState, create_app
from replayjax.server.chat import ChatTemplate
from replayjax.server.metrics import Metrics
from replayjax.server.protocol import ApiError, ServedModel, parse_chat
from tests.replayjax.server.test_app import ByteTokenizer

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "hours": {"type": "array"}, "where": {"type": "object"}, "zip": {"type": "string"}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {}}}}
HERMES = T.Tools((WEATHER, TIME), "hermes")
XML = T.Tools((WEATHER, TIME), "xml")
TOOLCALL = T.Tools((WEATHER, TIME), "toolcall")

# minimal templates of each format (the real ones write the same blocks around more prose)
TEMPLATES = {
    "hermes": "{% if tools %}Tools:{% for t in tools %}{{ t | tojson }}{% endfor %}\n"
              "Call as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>\n{% endif %}"
              "{% for m in messages %}{{ m.role }}: {{ m.content or '' }}"
              "{% for c in m.tool_calls or [] %}<tool_call>{\"name\": \"{{ c.function.name }}\", "
              "\"arguments\": {{ c.function.arguments | tojson }}}</tool_call>{% endfor %}\n"
              "{% endfor %}assistant:",
    "xml": "{% if tools %}{% for t in tools %}{{ t.function.description }} {% endfor %}\n"
           "Call as <tool_call><function=NAME><parameter=P>V</parameter></function></tool_call>"
           "{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content or '' }}"
           "{% for c in m.tool_calls or [] %}<tool_call>\n<function={{ c.function.name }}>\n"
           "{% for k, v in c.function.arguments | items %}<parameter={{ k }}>\n{{ v }}\n"
           "</parameter>\n{% endfor %}</function>\n</tool_call>{% endfor %}\n"
           "{% endfor %}assistant:",
    "toolcall": "{% if tools %}{{ tools | tojson }} <TOOLCALL>[...]</TOOLCALL>{% endif %}"
                "{% for m in messages %}{{ m.role }}: {{ m.content or '' }}\n{% endfor %}"
                "assistant:",
}


def test_the_format_is_read_off_the_template():
    assert {f: T.template_format(src) for f, src in TEMPLATES.items()} == {
        f: f for f in TEMPLATES}
    plain = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert T.template_format(plain) is None and T.template_format(None) is None
    # a template that shows <tool_call> but never reads `tools` renders none
    assert T.template_format(plain + "<tool_call>") is None


REPLIES = {
    "hermes": ('I will check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
               '"Paris", "days": 3}}\n</tool_call>\n<tool_call>\n{"name": "get_time", '
               '"arguments": {}}\n</tool_call>', HERMES),
    "xml": ("I will check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n"
            "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n"
            "</parameter>\n<parameter=hours>\n[1, 2]\n</parameter>\n<parameter=where>\n"
            "{\"lat\": 1.5}\n</parameter>\n<parameter=zip>\n12345\n</parameter>\n"
            "<parameter=other>\nline one\nline two\n</parameter>\n</function>\n</tool_call>\n"
            "<tool_call>\n<function=get_time>\n</function>\n</tool_call>", XML),
    "toolcall": ('I will check.\n<TOOLCALL>[{"name": "get_weather", "arguments": {"city": '
                 '"Paris", "days": 3}}, {"name": "get_time", "arguments": {}}]</TOOLCALL>',
                 TOOLCALL),
}
WANT_ARGS = {
    "hermes": {"city": "Paris", "days": 3},
    # typed by the schema: strings stay text (even a zip code of digits), the rest is JSON; a
    # parameter the schema does not name stays text, its inner newline kept
    "xml": {"city": "New York", "days": 3, "metric": True, "hours": [1, 2],
            "where": {"lat": 1.5}, "zip": "12345", "other": "line one\nline two"},
    "toolcall": {"city": "Paris", "days": 3},
}


@pytest.mark.parametrize("fmt", list(REPLIES))
def test_a_reply_splits_into_content_and_calls(fmt):
    text, tools = REPLIES[fmt]
    content, calls = T.split_reply(text, tools)
    assert content == "I will check."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [WANT_ARGS[fmt], {}]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2
    # parallel_tool_calls false: the first call only
    one = T.Tools(tools.specs, fmt, parallel=False)
    assert [c["function"]["name"] for c in T.split_reply(text, one)[1]] == ["get_weather"]
    # only whitespace besides the calls: content None
    start = text.index("<")
    assert T.split_reply("\n " + text[start:], tools)[0] is None


@pytest.mark.parametrize("fmt,text", [
    ("hermes", "no calls here"),
    ("hermes", "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}"),       # not closed
    ("hermes", "<tool_call>{not json}</tool_call>"),
    ("hermes", "<tool_call>{\"arguments\": {}}</tool_call>"),                   # no name
    ("hermes", "<tool_call>{\"name\": \"f\", \"arguments\": 3}</tool_call>"),
    ("hermes", "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>[</tool_call>"),   # one bad
    ("xml", "<tool_call><function=f>stray text</function></tool_call>"),
    ("xml", "<tool_call>no function</tool_call>"),
    ("toolcall", "<TOOLCALL>[{\"name\": \"f\"}, 3]</TOOLCALL>"),
    ("toolcall", "<TOOLCALL>[]</TOOLCALL>"),
])
def test_a_reply_that_does_not_parse_is_content(fmt, text):
    tools = T.Tools((WEATHER,), fmt)
    assert T.split_reply(text, tools) == (text, [])


@pytest.mark.parametrize("fmt", list(REPLIES))
def test_streamed_in_any_pieces_the_calls_are_the_same(fmt):
    """Every split of the reply into three pieces: the content sent before the calls is the
    text before the first tag, nothing of a tag leaks, and the calls are the whole reply's."""
    text, tools = REPLIES[fmt]
    want = [(c["function"]["name"], c["function"]["arguments"])
            for c in T.split_reply(text, tools)[1]]
    for i, j in itertools.combinations(range(1, len(text)), 2):
        stream = T.ToolStream(tools)
        sent = "".join(stream.push(p) for p in (text[:i], text[i:j], text[j:]))
        rest, calls = stream.finish()
        assert sent == "I will check.\n" and rest == ""
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == want
    # without a call, every byte comes out (a tag's prefix held back, then sent)
    stream = T.ToolStream(tools)
    sent = "".join(stream.push(p) for p in ("a <tool", "_ca", "b <TOOL", "x"))
    assert sent + stream.finish()[0] == "a <tool_cab <TOOLx" and stream.finish()[1] == []


@pytest.mark.parametrize("tools,choice,param", [
    ("f", "auto", "tools"), ([3], "auto", "tools[0]"),
    ([{"type": "code_interpreter"}], "auto", "tools[0]"),
    ([{"type": "function", "function": {"name": "a b"}}], "auto", "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "x" * 65}}], "auto", "tools[0].function.name"),
    ([WEATHER, WEATHER], "auto", "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "f"}, "x": 1}], "auto", "tools[0]"),
    ([{"type": "function", "function": {"name": "f", "args": {}}}], "auto",
     "tools[0].function"),
    ([{"type": "function", "function": {"name": "f", "parameters": "{}"}}], "auto",
     "tools[0].function.parameters"),
])
def test_bad_tools_are_named(tools, choice, param):
    with pytest.raises(T.ToolError) as e:
        T.check_tools(tools, choice, True, "hermes")
    assert e.value.param == param


def test_tools_need_a_format_unless_none_are_asked_for():
    assert T.check_tools([], "auto", True, None) is None
    assert T.check_tools([WEATHER], "none", True, None) is None      # rendered without tools
    with pytest.raises(T.ToolError, match="describes no tool-call format"):
        T.check_tools([WEATHER], "auto", True, None)
    got = T.check_tools([WEATHER], "auto", False, "xml")
    assert got == T.Tools((WEATHER,), "xml", False)


def encode(text):
    return list(text.encode())


SERVED = ServedModel(name="m", vocab=256, max_len=4096, num_draft=0,
                     defaults=SamplingParams(temperature=0.0))


@pytest.mark.parametrize("fmt", list(TEMPLATES))
def test_the_template_renders_tools_and_history(fmt):
    """parse_chat hands the template the request's tools and an assistant turn's calls with
    their arguments as a mapping (OpenAI sends a JSON string), and the choices carry the
    tools; tool_choice "none" renders none."""
    template = ChatTemplate(TEMPLATES[fmt], {})
    seen = []

    def render(messages, kwargs):
        seen.append(template.render(messages, kwargs))
        return seen[-1]
    body = {"model": "m", "tools": [WEATHER], "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type":
            "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]}
    [params] = parse_chat(body, SERVED, render, encode, tool_format=fmt)
    described = "The weather in a city."
    assert params.tools == T.Tools((WEATHER,), fmt) and described in seen[-1]
    if fmt != "toolcall":       # (its template shows no history calls)
        assert {"hermes": '"arguments": {"city": "Oslo"}',
                "xml": "<parameter=city>\nOslo\n</parameter>"}[fmt] in seen[-1]
    [params] = parse_chat({**body, "tool_choice": "none"}, SERVED, render, encode,
                          tool_format=fmt)
    assert params.tools is None and described not in seen[-1]


class ScriptWorker:
    """Answers every request with `reply`, a token (byte) per event, finishing `reason`; with
    `logprobs` (token -> (logprob, alternatives)) each event carries its token's."""
    failed = None

    def __init__(self, reply: str, reason: str = "stop", logprobs=None):
        self.tokens, self.reason, self.logprobs = list(reply.encode()), reason, logprobs

    def load(self):
        return 0, 0, 4

    def submit(self, request, deliver):
        for i, t in enumerate(self.tokens):
            done = (Completion(request.id, self.tokens, self.reason, 0.0, 0.0)
                    if i == len(self.tokens) - 1 else None)
            deliver(Event(request.id, [t], done,
                          logprobs=[self.logprobs(t)] if self.logprobs else None))

    def cancel(self, request_id):
        pass


def _client(reply, fmt="hermes"):
    worker = ScriptWorker(reply)
    state = ServerState(worker=worker, tokenizer=ByteTokenizer(),
                        chat_template=ChatTemplate(TEMPLATES[fmt], {}), served=SERVED,
                        metrics=Metrics(worker.load, 0), max_queue=4,
                        tool_format=T.template_format(TEMPLATES[fmt]))
    return TestClient(create_app(state), raise_server_exceptions=False)


def _chat(**extra):
    return {"model": "m", "messages": [{"role": "user", "content": "weather in Paris?"}],
            "max_tokens": 400, **extra}


@pytest.mark.parametrize("fmt", list(REPLIES))
def test_the_server_answers_tool_calls(fmt):
    text, _ = REPLIES[fmt]
    c = _client(text, fmt)
    r = c.post("/v1/chat/completions", json=_chat(tools=[WEATHER, TIME]))
    assert r.status_code == 200, r.text
    choice = oa.ChatCompletion.model_validate(r.json()).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "I will check."
    assert [(t.function.name, json.loads(t.function.arguments))
            for t in choice.message.tool_calls] == [("get_weather", WANT_ARGS[fmt]),
                                                    ("get_time", {})]
    # without tools the same reply is plain text
    r = c.post("/v1/chat/completions", json=_chat())
    assert r.json()["choices"][0]["message"] == {"role": "assistant", "content": text}
    assert r.json()["choices"][0]["finish_reason"] == "stop"


def _streamed(c, body):
    """The stream's chunks (validated as OpenAI's) and, per choice, its content, its calls
    put together from their deltas as a client does, and its finish reason."""
    r = c.post("/v1/chat/completions", json={**body, "stream": True})
    assert r.status_code == 200, r.text
    events = [line[len("data: "):] for line in r.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    content, calls, reason = "", {}, None
    for e in events[:-1]:
        chunk = oa.ChatCompletionChunk.model_validate(json.loads(e))
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for d in ch.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
                call["name"] += d.function.name or ""
                call["arguments"] += d.function.arguments or ""
            reason = ch.finish_reason or reason
    return content, [calls[i] for i in sorted(calls)], reason


@pytest.mark.parametrize("fmt", list(REPLIES))
def test_the_server_streams_tool_calls(fmt):
    text, _ = REPLIES[fmt]
    c = _client(text, fmt)
    content, calls, reason = _streamed(c, _chat(tools=[WEATHER, TIME]))
    assert content == "I will check.\n" and reason == "tool_calls"
    assert [(x["name"], json.loads(x["arguments"])) for x in calls] == [
        ("get_weather", WANT_ARGS[fmt]), ("get_time", {})]
    assert all(x["id"].startswith("call_") for x in calls)
    content, calls, reason = _streamed(c, _chat(tools=[WEATHER], parallel_tool_calls=False))
    assert [x["name"] for x in calls] == ["get_weather"]
    # a reply without a call streams all of its text
    content, calls, reason = _streamed(_client("a <tool_ca b", fmt), _chat(tools=[WEATHER]))
    assert (content, calls, reason) == ("a <tool_ca b", [], "stop")


def test_tools_on_a_template_without_them_are_a_400():
    worker = ScriptWorker("x")
    state = ServerState(worker=worker, tokenizer=ByteTokenizer(),
                        chat_template=ChatTemplate("{{ messages[0].content }}", {}),
                        served=SERVED, metrics=Metrics(worker.load, 0), max_queue=4)
    r = TestClient(create_app(state)).post("/v1/chat/completions", json=_chat(tools=[WEATHER]))
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    assert "--tool-call-format" in r.json()["error"]["message"]


def test_history_calls_read_their_arguments():
    calls = T.history_calls([{"id": "c", "type": "function", "function": {
        "name": "f", "arguments": '{"a": [1]}'}}, {"function": {"name": "g", "arguments": ""}},
        {"function": {"name": "h", "arguments": {"b": 2}}}], "m")
    assert [c["function"]["arguments"] for c in calls] == [{"a": [1]}, {}, {"b": 2}]
    assert calls[0]["id"] == "c"
    unclosed = [{"function": {"name": "f", "arguments": "{"}}]
    for bad, param in [("x", "m"), ([{"function": {}}], "m[0]"),
                       (unclosed, "m[0].function.arguments")]:
        with pytest.raises(T.ToolError) as e:
            T.history_calls(bad, "m")
        assert e.value.param == param
    with pytest.raises(ApiError):
        parse_chat({"model": "m", "messages": [{"role": "assistant", "content": None,
                                                "tool_calls": "x"}]}, SERVED,
                   lambda m, k: "x", encode, tool_format="hermes")


NAMED = {"type": "function", "function": {"name": "get_weather"}}
CONTINUATIONS = {   # what a model writes after the forced start of a call to get_weather
    "hermes": '{"city": "Paris", "days": 3}}\n</tool_call>',
    "xml": "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
           "</function>\n</tool_call>",
    "toolcall": '{"city": "Paris", "days": 3}}]</TOOLCALL>',
}


@pytest.mark.parametrize("fmt", list(TEMPLATES))
def test_tool_choice_forces_a_call_by_the_prompt(fmt):
    """tool_choice "required" / a named function: the prompt ends with a block's opening (up
    to the named function's arguments), the reply read from it; a named call is the only one;
    a think block the prompt opened is closed first."""
    required = T.check_tools([WEATHER, TIME], "required", True, fmt)
    named = T.check_tools([WEATHER, TIME], NAMED, True, fmt)
    assert required.parallel and not named.parallel
    assert required.forced == {"hermes": "<tool_call>\n", "xml": "<tool_call>\n",
                               "toolcall": "<TOOLCALL>["}[fmt]
    assert named.forced.startswith(required.forced) and "get_weather" in named.forced
    [call] = T.split_reply(CONTINUATIONS[fmt], named)[1]     # (the text after the forced start)
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == (
        "get_weather", {"city": "Paris", "days": 3})
    body = {"model": "m", "tools": [WEATHER], "tool_choice": NAMED,
            "messages": [{"role": "user", "content": "x"}]}
    opened = lambda m, kw: "user: x\nassistant: <think>\n"
    [p] = parse_chat(body, SERVED, opened, encode, tool_format=fmt, reasoning=True)
    assert bytes(p.prompt).decode() == (
        "user: x\nassistant: <think>\n\n</think>\n\n" + named.forced)
    assert p.thinking is False


@pytest.mark.parametrize("choice,param,match", [
    ({"type": "function", "function": {"name": "nope"}}, "tool_choice", "not among"),
    ({"type": "function"}, "tool_choice", "expected"),
    ("always", "tool_choice", "expected"),
])
def test_bad_tool_choice_is_named(choice, param, match):
    with pytest.raises(T.ToolError, match=match) as e:
        T.check_tools([WEATHER], choice, True, "hermes")
    assert e.value.param == param
    with pytest.raises(T.ToolError, match="needs 'tools'"):
        T.check_tools(None, "required", True, "hermes")


@pytest.mark.parametrize("fmt", list(TEMPLATES))
def test_the_server_answers_a_forced_call(fmt):
    c = _client(CONTINUATIONS[fmt], fmt)
    body = _chat(tools=[WEATHER, TIME], tool_choice=NAMED)
    out = c.post("/v1/chat/completions", json=body).json()
    choice = oa.ChatCompletion.model_validate(out).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert [(t.function.name, json.loads(t.function.arguments))
            for t in choice.message.tool_calls] == [("get_weather", {"city": "Paris",
                                                                      "days": 3})]
    content, calls, reason = _streamed(c, body)
    assert (content, reason) == ("", "tool_calls")
    assert [(x["name"], json.loads(x["arguments"])) for x in calls] == [
        ("get_weather", {"city": "Paris", "days": 3})]
