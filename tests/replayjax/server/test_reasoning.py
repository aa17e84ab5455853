"""A reasoning model's thinking split off its chat replies (`replayjax.server.reasoning`): whole
and streamed in any pieces alike, from a think block the prompt opened or the reply opens, with
tool calls after it, and in the server's answers (`reasoning_content`)."""

import itertools
import json

import openai.types.chat as oa
import pytest
from starlette.testclient import TestClient

from replayjax.server import reasoning as R
from replayjax.server.app import ServerState, create_app
from replayjax.server.chat import ChatTemplate
from replayjax.server.metrics import Metrics
from replayjax.server.tools import template_format
from tests.replayjax.server.test_app import ByteTokenizer
from tests.replayjax.server.test_tools import REPLIES, SERVED, WANT_ARGS, WEATHER, ScriptWorker

CASES = [   # reply, the prompt opened a think block, (reasoning, content)
    ("<think>\nhmm\n</think>\n\nHi there", False, ("hmm", "Hi there")),
    ("hmm\nmore\n</think>\n\nHi", True, ("hmm\nmore", "Hi")),
    ("  <think>a</think>b", False, ("a", "b")),
    ("Hi <think> x", False, (None, "Hi <think> x")),          # not at the start: content
    ("  \n", False, (None, "  \n")),
    ("<thi", False, (None, "<thi")),
    ("all thought\n", True, ("all thought", "")),              # cut before </think>
    ("\n\n<think>\n\n</think>\n\nanswer", False, (None, "answer")),
    ("x</think>", True, ("x", "")),
    ("a</think>b</think>c", True, ("a", "b</think>c")),
]


CALL = "<tool_call>"
CALL_CASES = [   # with tools: a call's tag ends the thinking too, and stays in the answer
    ("plan\n<tool_call>{}</tool_call>", True, ("plan", "<tool_call>{}</tool_call>")),
    ("plan</think>\n\n<tool_call>x", True, ("plan", "<tool_call>x")),
    ("<think>a<tool_call>b</think>c", False, ("a", "<tool_call>b</think>c")),
    ("a <tool_ca", True, ("a <tool_ca", "")),
]


@pytest.mark.parametrize("text,thinking,want,call", [c + (None,) for c in CASES] +
                         [c + (CALL,) for c in CALL_CASES])
def test_a_reply_splits_alike_whole_and_in_any_pieces(text, thinking, want, call):
    assert R.split_reasoning(text, thinking, call) == want
    for i, j in itertools.combinations(range(len(text) + 1), 2):
        stream = R.ReasoningStream(thinking, call)
        parts = [stream.push(p) for p in (text[:i], text[i:j], text[j:])] + [stream.finish()]
        assert ("".join(p[0] for p in parts) or None, "".join(p[1] for p in parts)) == want


def test_the_prompt_tells_an_open_think_block():
    assert R.open_after("<|im_start|>assistant\n<think>\n")
    assert not R.open_after("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not R.open_after("User: hi\nAssistant:")
    assert R.template_thinks("{{ '<think>' }}...{{ '</think>' }}")
    assert not R.template_thinks("{{ messages }}") and not R.template_thinks(None)


# the generation prompt opens a think block unless enable_thinking is false (as Qwen3.5's)
THINKING = ("{% if tools %}{% for t in tools %}{{ t | tojson }}{% endfor %} <tool_call>"
            "{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
            "assistant:{% if enable_thinking is defined and not enable_thinking %}"
            "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}")


def _client(reply, reasoning=True):
    worker = ScriptWorker(reply)
    state = ServerState(worker=worker, tokenizer=ByteTokenizer(),
                        chat_template=ChatTemplate(THINKING, {}), served=SERVED,
                        metrics=Metrics(worker.load, 0), max_queue=4,
                        tool_format=template_format(THINKING), reasoning=reasoning)
    return TestClient(create_app(state), raise_server_exceptions=False)


def _body(**extra):
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 400,
            **extra}


def _stream(c, body):
    r = c.post("/v1/chat/completions", json={**body, "stream": True})
    events = [e[len("data: "):] for e in r.text.split("\n\n") if e][:-1]
    thought, content, calls, reason = "", "", [], None
    for e in events:
        chunk = json.loads(e)
        oa.ChatCompletionChunk.model_validate(chunk)
        for ch in chunk["choices"]:
            d = ch["delta"]
            thought += d.get("reasoning_content") or ""
            content += d.get("content") or ""
            calls += [(t["function"]["name"], json.loads(t["function"]["arguments"]))
                      for t in d.get("tool_calls") or []]
            reason = ch["finish_reason"] or reason
    return thought, content, calls, reason


def test_the_server_answers_thinking_apart():
    reply = "I should greet.\n</think>\n\nHello!"
    c = _client(reply)
    out = c.post("/v1/chat/completions", json=_body()).json()
    message = oa.ChatCompletion.model_validate(out).choices[0].message
    assert (message.content, out["choices"][0]["message"]["reasoning_content"]) == (
        "Hello!", "I should greet.")
    assert _stream(c, _body()) == ("I should greet.", "Hello!", [], "stop")
    # thinking off in the template: the reply is content (n = 2: each choice alike)
    out = c.post("/v1/chat/completions", json=_body(
        n=2, chat_template_kwargs={"enable_thinking": False})).json()
    assert [ch["message"] for ch in out["choices"]] == [
        {"role": "assistant", "content": reply}] * 2
    # the server told not to split (--reasoning none)
    out = _client(reply, reasoning=False).post("/v1/chat/completions", json=_body()).json()
    assert out["choices"][0]["message"] == {"role": "assistant", "content": reply}


def test_tool_calls_after_thinking():
    text, _ = REPLIES["hermes"]
    c = _client("Paris needs a lookup.\n</think>\n\n" + text)
    out = c.post("/v1/chat/completions", json=_body(tools=[WEATHER])).json()
    choice = oa.ChatCompletion.model_validate(out).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "I will check."
    assert out["choices"][0]["message"]["reasoning_content"] == "Paris needs a lookup."
    assert [(t.function.name, json.loads(t.function.arguments))
            for t in choice.message.tool_calls] == [("get_weather", WANT_ARGS["hermes"]),
                                                    ("get_time", {})]
    assert _stream(c, _body(tools=[WEATHER])) == (
        "Paris needs a lookup.", "I will check.\n",
        [("get_weather", WANT_ARGS["hermes"]), ("get_time", {})], "tool_calls")


def test_a_call_inside_the_thinking_ends_it():
    """Qwen3.5 may open a tool call without closing its think block: the call is read, the
    text before it is thinking."""
    text, _ = REPLIES["hermes"]
    c = _client("Paris needs a lookup.\n" + text)
    out = c.post("/v1/chat/completions", json=_body(tools=[WEATHER])).json()
    message = out["choices"][0]["message"]
    assert out["choices"][0]["finish_reason"] == "tool_calls" and message["content"] is None
    assert message["reasoning_content"] == "Paris needs a lookup.\nI will check."
    assert [t["function"]["name"] for t in message["tool_calls"]] == ["get_weather", "get_time"]
    thought, content, calls, reason = _stream(c, _body(tools=[WEATHER]))
    assert (thought, content, reason) == ("Paris needs a lookup.\nI will check.", "",
                                          "tool_calls")
    assert [name for name, _ in calls] == ["get_weather", "get_time"]
    # without tools the tag is no end: all of it is thinking
    out = c.post("/v1/chat/completions", json=_body()).json()
    assert out["choices"][0]["message"]["content"] == ""
