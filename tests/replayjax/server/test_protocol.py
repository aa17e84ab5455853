"""Request checks of replayjax.server.protocol: what a valid body becomes, and the error
(status, param, code) of an invalid one."""

import dataclasses

import pytest

from replayjax.sampling import SamplingParams
from replayjax.server.protocol import ApiError, ServedModel, parse_chat, parse_completion

SERVED = ServedModel(name="m", vocab=256, max_len=64, num_draft=2, eos_ids=(7,),
                     defaults=SamplingParams(temperature=0.0))


def encode(text):
    return list(text.encode())


def render(messages, kwargs):
    return "".join(f"{m['role']}:{m['content']}\n" for m in messages)


def completion(**body):
    """The one choice of a completion request."""
    [params] = parse_completion({"model": "m", "prompt": "hello", **body}, SERVED, encode)
    return params


def test_defaults_fit_the_cache_and_eos_stops():
    p = completion()
    # OpenAI's completions default: 16 tokens, or the room the context leaves if less
    assert p.prompt == list(b"hello") and p.max_tokens == 16
    assert completion(prompt="x" * 50).max_tokens == 64 - 50 - 2
    assert p.stop_ids == (7,) and p.sampling.temperature == 0.0 and not p.stream
    assert completion(ignore_eos=True, stop_token_ids=[9]).stop_ids == (9,)
    assert completion(stop_token_ids=[7, 9]).stop_ids == (7, 9)


def test_fields_become_params():
    p = completion(prompt=[1, 2, 3], max_tokens=5, temperature=0.7, top_p=0.9, top_k=-1, seed=3,
                   stop="x", stream=True, stream_options={"include_usage": True}, n=1,
                   presence_penalty=0.0, frequency_penalty=0, user="u", logprobs=None,
                   echo=False)
    assert p.prompt == [1, 2, 3] and p.max_tokens == 5 and p.stop == ("x",)
    assert p.sampling == SamplingParams(0.7, 0, 0.9, 3)
    assert p.stream and p.include_usage


def test_unsupported_values_are_shown_as_json():
    with pytest.raises(ApiError, match=r"'best_of' = true is not supported by this server "
                                       r"\(only 1\)"):
        completion(best_of=True)


def test_prompt_lists_and_n_are_choices_in_openais_order():
    """A list of prompts (strings or token-id lists: LangChain sends a one-element list) and n
    choices each: choice i n + j is prompt i's j-th; seeds seed + j, so a prompt's choices
    differ and the request is reproducible; unseeded choices get seeds of their own."""
    [one] = parse_completion({"model": "m", "prompt": ["hello"]}, SERVED, encode)
    assert one == dataclasses.replace(completion(), sampling=one.sampling)
    got = parse_completion({"model": "m", "prompt": ["ab", "c"], "n": 3, "seed": 2 ** 31 - 2,
                            "max_tokens": 4}, SERVED, encode)
    assert [(p.prompt, p.choice) for p in got] == [
        (list(b"ab"), 0), (list(b"ab"), 1), (list(b"ab"), 2),
        (list(b"c"), 0), (list(b"c"), 1), (list(b"c"), 2)]
    assert [p.sampling.seed for p in got] == [2 ** 31 - 2, 2 ** 31 - 1, 0] * 2
    assert {p.max_tokens for p in got} == {4}
    ids = parse_completion({"model": "m", "prompt": [[1, 2], [3]]}, SERVED, encode)
    assert [p.prompt for p in ids] == [[1, 2], [3]]
    chat = parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2},
                      SERVED, render, encode)
    assert [p.choice for p in chat] == [0, 1] and chat[0].prompt == chat[1].prompt
    unseeded = parse_completion({"model": "m", "prompt": "x", "n": 8}, SERVED, encode)
    assert len({p.sampling.seed for p in unseeded}) > 1


def test_chat_messages_and_max_completion_tokens():
    [p] = parse_chat({"model": "m", "messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text",
                                                                      "text": "b"}]}],
        "max_completion_tokens": 4}, SERVED, render, encode)
    assert p.prompt == encode("system:s\nuser:a\nb\n") and p.max_tokens == 4
    seen = []
    parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}],
                "chat_template_kwargs": {"enable_thinking": True, "add_generation_prompt": True}},
               SERVED, lambda messages, kwargs: seen.append(kwargs) or "x", encode)
    assert seen == [{"enable_thinking": True, "add_generation_prompt": True}]


@pytest.mark.parametrize("body,status,param,code", [
    ({"prompt": "x"}, 400, "model", None),
    ({"model": "other", "prompt": "x"}, 404, "model", "model_not_found"),
    ({"model": "m"}, 400, "prompt", None),
    ({"model": "m", "prompt": 5}, 400, "prompt", None),
    ({"model": "m", "prompt": ["a", 5]}, 400, "prompt", None),
    ({"model": "m", "prompt": [[1], "b"]}, 400, "prompt", None),
    ({"model": "m", "prompt": [[1], []]}, 400, "prompt[1]", None),
    ({"model": "m", "prompt": []}, 400, "prompt", None),
    ({"model": "m", "prompt": [[]]}, 400, "prompt", None),
    ({"model": "m", "prompt": ["a", [1, 300]]}, 400, "prompt", None),
    ({"model": "m", "prompt": ["x", "x" * 62]}, 400, "prompt[1]", "context_length_exceeded"),
    ({"model": "m", "prompt": ""}, 400, "prompt", None),
    ({"model": "m", "prompt": [1, 256]}, 400, "prompt", None),
    ({"model": "m", "prompt": [1, -1]}, 400, "prompt", None),
    ({"model": "m", "prompt": [True]}, 400, "prompt", None),
    ({"model": "m", "prompt": "x" * 62}, 400, "prompt", "context_length_exceeded"),
    ({"model": "m", "prompt": "x" * 10, "max_tokens": 53}, 400, "max_tokens",
     "context_length_exceeded"),
    ({"model": "m", "prompt": "x", "max_tokens": 0}, 400, "max_tokens", None),
    ({"model": "m", "prompt": "x", "max_tokens": "5"}, 400, "max_tokens", None),
    ({"model": "m", "prompt": "x", "temperature": -0.1}, 400, "temperature", None),
    ({"model": "m", "prompt": "x", "temperature": 2.5}, 400, "temperature", None),
    ({"model": "m", "prompt": "x", "top_p": 0}, 400, "top_p", None),
    ({"model": "m", "prompt": "x", "top_k": -2}, 400, "top_k", None),
    ({"model": "m", "prompt": "x", "top_k": 2 ** 31}, 400, "top_k", None),
    ({"model": "m", "prompt": "x", "user": 5}, 400, "user", None),
    ({"model": "m", "prompt": "x", "store": "yes"}, 400, "store", None),
    ({"model": "m", "prompt": "x", "seed": -1}, 400, "seed", None),
    ({"model": "m", "prompt": "x", "seed": 2 ** 40}, 400, "seed", None),
    ({"model": "m", "prompt": "x", "n": 0}, 400, "n", None),
    ({"model": "m", "prompt": "x", "n": 65}, 400, "n", None),
    ({"model": "m", "prompt": ["x"] * 33, "n": 2}, 400, "n", None),
    ({"model": "m", "prompt": ["x"] * 65}, 400, "prompt", None),
    ({"model": "m", "prompt": "x", "n": 2, "best_of": 1}, 400, "best_of", None),
    ({"model": "m", "prompt": "x", "best_of": 3}, 400, "best_of", "unsupported_parameter"),
    ({"model": "m", "prompt": "x", "logprobs": 2}, 400, "logprobs", "unsupported_parameter"),
    # booleans are not numbers: True == 1 and 0 == False in Python, not in the API (logprobs 0
    # asks for the sampled tokens' log probabilities)
    ({"model": "m", "prompt": "x", "logprobs": 0}, 400, "logprobs", "unsupported_parameter"),
    ({"model": "m", "prompt": "x", "n": True}, 400, "n", None),
    ({"model": "m", "prompt": "x", "best_of": True}, 400, "best_of", "unsupported_parameter"),
    ({"model": "m", "prompt": "x", "echo": 0}, 400, "echo", "unsupported_parameter"),
    ({"model": "m", "prompt": "x", "presence_penalty": False}, 400, "presence_penalty",
     "unsupported_parameter"),
    ({"model": "m", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", None),
    ({"model": "m", "prompt": "x", "stop": [""]}, 400, "stop", None),
    ({"model": "m", "prompt": "x", "stop": 3}, 400, "stop", None),
    ({"model": "m", "prompt": "x", "stop_token_ids": [300]}, 400, "stop_token_ids", None),
    ({"model": "m", "prompt": "x", "stream": "yes"}, 400, "stream", None),
    ({"model": "m", "prompt": "x", "stream_options": {"include_usage": True}}, 400,
     "stream_options", None),
    ({"model": "m", "prompt": "x", "stream": True, "stream_options": {"x": 1}}, 400,
     "stream_options", None),
    ({"model": "m", "prompt": "x", "foo": 1}, 400, "foo", None),
    ({"model": "m", "prompt": "x", "messages": []}, 400, "messages", None),
])
def test_completion_errors(body, status, param, code):
    with pytest.raises(ApiError) as e:
        parse_completion(body, SERVED, encode)
    assert (e.value.status, e.value.param, e.value.code) == (status, param, code)
    err = e.value.body()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]


@pytest.mark.parametrize("body,param", [
    ({"model": "m"}, "messages"),
    ({"model": "m", "messages": []}, "messages"),
    ({"model": "m", "messages": "hi"}, "messages"),
    ({"model": "m", "messages": ["hi"]}, "messages[0]"),
    ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"model": "m", "messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages[0].content"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
      "max_completion_tokens": 2}, "max_completion_tokens"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{}]}, "tools[0]"),
    # a template without a tool-call format renders no tools (parse_chat's tool_format None)
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [
        {"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
     "tool_choice"),
    ({"model": "m", "messages": [{"role": "user", "content": "x", "tool_calls": []}]},
     "messages[0].tool_calls"),
    ({"model": "m", "messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}],
      "chat_template_kwargs": {"tools": []}}, "chat_template_kwargs"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "prompt": "x"}, "prompt"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": 0}, "logprobs"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": False},
     "top_logprobs"),
    # variables the server sets itself: the template would not see the request's values
    ({"model": "m", "messages": [{"role": "user", "content": "x"}],
      "chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}],
      "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
])
def test_chat_errors(body, param):
    with pytest.raises(ApiError) as e:
        parse_chat(body, SERVED, render, encode)
    assert e.value.status == 400 and e.value.param == param
