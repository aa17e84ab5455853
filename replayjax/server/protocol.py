"""The OpenAI API as this server speaks it: request bodies of /v1/completions and
/v1/chat/completions checked field by field into `GenerationParams` (an `ApiError` in OpenAI's
error shape otherwise), and the response, chunk and error shapes.

A request asks for one or more choices: `n` of them for each prompt (a completion's `prompt`
may be a list of prompts), at most MAX_CHOICES in all, choice i n + j being prompt i's j-th, as
OpenAI numbers them. Each choice is a `GenerationParams` of its own; with a `seed`, choice j of a
prompt samples with seed + j (mod 2^31), so a prompt's choices differ and the request is
reproducible.

Accepted beyond OpenAI's fields, as vLLM and SGLang accept them: `top_k` (0 or -1: off; the
vocabulary or more: every token), `stop_token_ids`, `ignore_eos`, `repetition_penalty` (1 only)
and, for chat, `chat_template_kwargs`. OpenAI fields this server does not implement are accepted
at their neutral value only (e.g. `best_of` = 1, `echo` false, `presence_penalty` 0); unknown
fields are refused, as OpenAI refuses them.

Log probabilities (completions `logprobs` N, chat `logprobs` + `top_logprobs` N) are the
model's own (the log-softmax of its logits, before temperature and filters), for a server
started with `--max-logprobs` (N at most that; the engine computes them for every token then).

Chat `tools` (function tools, `tool_choice`, `parallel_tool_calls`) are rendered by the chat
template and the reply is read in the tool-call format it describes
(`replayjax.server.tools`); assistant messages may carry `tool_calls`, "tool" messages answer
them. A reasoning model's thinking comes back as `reasoning_content`
(`replayjax.server.reasoning`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import time
import uuid
from collections.abc import Callable

from replayjax.commandline import is_unicode
from replayjax.requests import MAX_TOP_LOGPROBS
from replayjax.sampling import SEED_LIMIT, TOP_K_LIMIT, SamplingParams
from replayjax.server.reasoning import CLOSE, open_after
from replayjax.server.tools import ToolError, Tools, check_tools, history_calls

MAX_STOP_STRINGS = 4
MAX_CHOICES = 64            # prompts x n of one request
ROLES = ("system", "developer", "user", "assistant", "tool")


class ApiError(Exception):
    """An answer other than 200, in OpenAI's error shape."""

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.type, self.param, self.code = status, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(str(self), self.type, self.param, self.code)


def error_body(message, type="invalid_request_error", param=None, code=None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclasses.dataclass(frozen=True)
class ServedModel:
    """What request checks need to know about the model being served."""
    name: str                               # the "model" requests must name
    vocab: int
    max_len: int                            # cache length: prompt + max_tokens + drafts
    num_draft: int
    eos_ids: tuple = ()                     # stop ids unless ignore_eos
    defaults: SamplingParams = SamplingParams(temperature=1.0)   # for omitted fields
    max_logprobs: int | None = None         # alternatives a token's logprobs may list (None:
                                            # the engine computes no log probabilities)


@dataclasses.dataclass(frozen=True)
class GenerationParams:
    """A checked request: what the engine and the text stream need."""
    prompt: list                            # token ids
    max_tokens: int
    sampling: SamplingParams
    stop: tuple = ()                        # stop strings (cut before)
    stop_ids: tuple = ()                    # stop_token_ids, and the eos ids unless ignore_eos
    stream: bool = False
    include_usage: bool = False
    choice: int = 0                         # j of the prompt's n choices (usage counts j = 0)
    tools: Tools | None = None              # chat: the reply may call these
    logprobs: int | None = None             # each token's logprob and this many alternatives
    thinking: bool | None = None            # chat: split off the reply's thinking (None: not;
                                            # True: the prompt opened a think block)


# ---------------------------------------------------------------------- field checks

def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v):
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _shown(v, spell=repr):
    text = spell(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _invalid(name, want, value) -> ApiError:
    return ApiError(f"Invalid value for '{name}': expected {want}, got {_shown(value)}.",
                    param=name)


# name -> (check, what it must be); null (None) always means "not given"
_CHECKS = {
    "model": (lambda v: isinstance(v, str), "a string"),
    "max_tokens": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "max_completion_tokens": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "temperature": (lambda v: _is_number(v) and 0 <= v <= 2, "a number in [0, 2]"),
    "top_p": (lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "top_k": (lambda v: _is_int(v) and -1 <= v < TOP_K_LIMIT,
              "an integer in [-1, 2^31) (0 or -1: off)"),
    "seed": (lambda v: _is_int(v) and 0 <= v < SEED_LIMIT, "an integer in [0, 2^31)"),
    "n": (lambda v: _is_int(v) and 1 <= v <= MAX_CHOICES, f"an integer in [1, {MAX_CHOICES}]"),
    "stop": (lambda v: isinstance(v, str) or (isinstance(v, list) and all(
        isinstance(s, str) for s in v)), "a string or a list of strings"),
    "stop_token_ids": (lambda v: isinstance(v, list) and all(map(_is_int, v)),
                       "a list of integer token ids"),
    "ignore_eos": (lambda v: isinstance(v, bool), "a boolean"),
    "stream": (lambda v: isinstance(v, bool), "a boolean"),
    "stream_options": (lambda v: isinstance(v, dict), "an object"),
    "chat_template_kwargs": (lambda v: isinstance(v, dict), "an object"),
    # accepted and ignored (`_IGNORED`), but of OpenAI's types
    "user": (lambda v: isinstance(v, str), "a string"),
    "metadata": (lambda v: isinstance(v, dict), "an object"),
    "store": (lambda v: isinstance(v, bool), "a boolean"),
    "service_tier": (lambda v: isinstance(v, str), "a string"),
    "parallel_tool_calls": (lambda v: isinstance(v, bool), "a boolean"),
    "tool_choice": (lambda v: isinstance(v, (str, dict)), "a string or an object"),
    "prompt_cache_key": (lambda v: isinstance(v, str), "a string"),
    "safety_identifier": (lambda v: isinstance(v, str), "a string"),
}
# accepted at these values only (what OpenAI does by default); the server implements no other
_NEUTRAL = {
    "best_of": (1,), "echo": (False,), "suffix": ("",),
    "presence_penalty": (0,), "frequency_penalty": (0,),
    "repetition_penalty": (1,), "logit_bias": ({},), "functions": ([],),
    "function_call": ("none", "auto"),
    "response_format": ({"type": "text"},), "modalities": (["text"],), "audio": (),
    "prediction": (), "reasoning_effort": (), "web_search_options": (),
}
_IGNORED = ("user", "metadata", "store", "service_tier", "parallel_tool_calls",
            "prompt_cache_key", "safety_identifier")
_COMMON = ("model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
           "stop_token_ids", "ignore_eos", "stream", "stream_options", "n", "presence_penalty",
           "frequency_penalty", "repetition_penalty", "logit_bias", "logprobs") + _IGNORED
COMPLETION_FIELDS = frozenset(_COMMON + ("prompt", "best_of", "echo", "suffix"))
CHAT_FIELDS = frozenset(_COMMON + (
    "messages", "max_completion_tokens", "top_logprobs", "tools", "functions", "tool_choice",
    "function_call", "response_format", "modalities", "audio", "prediction", "reasoning_effort",
    "web_search_options", "chat_template_kwargs"))


def _json(v) -> str:
    return json.dumps(v, ensure_ascii=False)


def _is_neutral(value, allowed) -> bool:
    """Whether `value` is one of the neutral `allowed` values, booleans and numbers kept apart
    (Python's True == 1 and 0 == False: `n: true` is not `n: 1`, and `best_of: true` is not
    `best_of: 1`)."""
    return any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in allowed)


def check_unicode(body) -> None:
    """ApiError naming the top-level field when a string of the parsed body (a key or a value,
    at any depth) holds a lone UTF-16 surrogate such as "\\ud800": JSON can escape one, but it is
    no Unicode text, so it could be neither tokenized nor written back in a response."""
    stack = [(body, None)]
    while stack:                    # iterative: a body may nest as deep as the JSON parser lets
        v, field = stack.pop()
        if isinstance(v, dict):
            for k, x in v.items():
                name = k if field is None else field
                if not is_unicode(k):
                    raise ApiError("The request body has a field name that is not valid Unicode "
                                   "(a lone surrogate escape such as \\ud800).")
                stack.append((x, name))
        elif isinstance(v, list):
            stack.extend((x, field) for x in v)
        elif isinstance(v, str) and not is_unicode(v):
            where = f"'{field}'" if field is not None else "The request body"
            raise ApiError(f"Invalid value for {where}: the text is not valid Unicode (a lone "
                           f"surrogate escape such as \\ud800).", param=field)


def _checked_fields(body, known) -> dict:
    """body's fields, each valid (nulls dropped); ApiError for the first that is not."""
    if not isinstance(body, dict):
        raise ApiError(f"The request body must be a JSON object, got {type(body).__name__}.")
    if unknown := sorted(set(body) - known):
        raise ApiError(f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    fields = {k: v for k, v in body.items() if v is not None}
    for name, value in fields.items():
        if name in _CHECKS:
            ok, want = _CHECKS[name]
            if not ok(value):
                raise _invalid(name, want, value)
        elif name in _NEUTRAL and not _is_neutral(value, _NEUTRAL[name]):
            supported = " or ".join(map(_json, _NEUTRAL[name])) or "null"
            raise ApiError(f"'{name}' = {_shown(value, _json)} is not supported by this server "
                           f"(only {supported}).", param=name, code="unsupported_parameter")
    if "model" not in fields:
        raise ApiError("You must provide a model parameter.", param="model")
    return fields


def check_model(name: str, served: ServedModel) -> None:
    if name != served.name:
        raise ApiError(f"The model '{name}' does not exist (this server serves "
                       f"'{served.name}').", status=404, param="model", code="model_not_found")


def _stream_flags(fields) -> tuple[bool, bool]:
    stream, options = fields.get("stream", False), fields.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise ApiError("'stream_options' is only allowed when 'stream' is true.",
                       param="stream_options")
    if unknown := sorted(set(options) - {"include_usage"}):
        raise ApiError(f"Unrecognized field in 'stream_options': {unknown[0]}",
                       param="stream_options")
    usage = options.get("include_usage", False)
    if not isinstance(usage, bool):
        raise _invalid("stream_options.include_usage", "a boolean", usage)
    return stream, usage


# OpenAI's legacy /v1/completions generates 16 tokens when max_tokens is not given (chat: up to
# the context length), and clients written for it rely on that
COMPLETIONS_MAX_TOKENS = 16


def _choices(fields, prompts, served: ServedModel, *, max_tokens_field: str,
             prompt_field: str, default_max_tokens: int | None = None) -> list:
    """The request's choices, n for each prompt's token ids in `prompts` (the module docstring),
    every prompt checked before any is admitted; prompt i of several is named
    `prompt_field[i]`."""
    n = fields.get("n", 1)
    if n * len(prompts) > MAX_CHOICES:
        raise ApiError(f"The request asks for {n * len(prompts)} choices ({len(prompts)} prompts "
                       f"x n = {n}); this server answers at most {MAX_CHOICES} in one request.",
                       param="n" if n > 1 else prompt_field)
    if fields.get("best_of", n) < n:
        raise ApiError(f"'best_of' ({fields['best_of']}) must be at least 'n' ({n}).",
                       param="best_of")
    seed = fields.get("seed")
    out = []
    for i, prompt in enumerate(prompts):
        where = f"{prompt_field}[{i}]" if len(prompts) > 1 else prompt_field
        one = _params(fields, prompt, served, max_tokens_field=max_tokens_field,
                      prompt_field=where, default_max_tokens=default_max_tokens)
        out += [one if j == 0 else dataclasses.replace(one, choice=j, sampling=dataclasses.replace(
            one.sampling, seed=random.randrange(SEED_LIMIT) if seed is None
            else (seed + j) % SEED_LIMIT)) for j in range(n)]
    return out


def _params(fields, prompt, served: ServedModel, *, max_tokens_field: str,
            prompt_field: str, default_max_tokens: int | None = None) -> GenerationParams:
    """GenerationParams of one prompt's token ids from checked fields; without max_tokens,
    `default_max_tokens` (None: the room the context leaves), at most that room."""
    if not prompt:
        raise ApiError("The prompt is empty.", param=prompt_field)
    if bad := [t for t in prompt if not 0 <= t < served.vocab]:
        raise ApiError(f"Token ids {bad[:5]} in '{prompt_field}' are outside the vocabulary "
                       f"[0, {served.vocab}).", param=prompt_field)
    room = served.max_len - len(prompt) - served.num_draft
    drafts = f" + {served.num_draft} speculative drafts" if served.num_draft else ""
    if room < 1:
        raise ApiError(f"This model's maximum context length is {served.max_len} tokens; the "
                       f"prompt has {len(prompt)} tokens{drafts}, leaving no room to generate.",
                       param=prompt_field, code="context_length_exceeded")
    max_tokens = fields.get(max_tokens_field, min(default_max_tokens or room, room))
    if max_tokens > room:
        raise ApiError(f"This model's maximum context length is {served.max_len} tokens. "
                       f"However, you requested {len(prompt) + max_tokens + served.num_draft} "
                       f"tokens ({len(prompt)} in the prompt, {max_tokens} for the "
                       f"completion{drafts}). Please reduce the prompt or the completion "
                       f"length.", param=max_tokens_field, code="context_length_exceeded")
    stop = fields.get("stop", [])
    stop = [stop] if isinstance(stop, str) else stop
    if len(stop) > MAX_STOP_STRINGS:
        raise _invalid("stop", f"at most {MAX_STOP_STRINGS} strings", stop)
    if "" in stop:
        raise _invalid("stop", "non-empty strings", stop)
    stop_ids = fields.get("stop_token_ids", [])
    if bad := [t for t in stop_ids if not 0 <= t < served.vocab]:
        raise ApiError(f"Token ids {bad[:5]} in 'stop_token_ids' are outside the vocabulary "
                       f"[0, {served.vocab}).", param="stop_token_ids")
    if not fields.get("ignore_eos", False):
        stop_ids = list(stop_ids) + [t for t in served.eos_ids if t not in stop_ids]
    d = served.defaults
    top_k = fields.get("top_k", d.top_k)
    sampling = SamplingParams(temperature=float(fields.get("temperature", d.temperature)),
                              top_k=max(top_k, 0), top_p=float(fields.get("top_p", d.top_p)),
                              seed=fields.get("seed", random.randrange(SEED_LIMIT)))
    stream, usage = _stream_flags(fields)
    return GenerationParams(prompt=list(prompt), max_tokens=max_tokens, sampling=sampling,
                            stop=tuple(dict.fromkeys(stop)), stop_ids=tuple(stop_ids),
                            stream=stream, include_usage=usage)


def _prompts(prompt, encode) -> list:
    """A completion's `prompt` as token-id lists: a string (tokenized by `encode`, special
    tokens added) or a list of token ids is one prompt; a list of strings or of token-id lists
    is several."""
    is_ids = lambda v: isinstance(v, list) and all(map(_is_int, v))
    if isinstance(prompt, str):
        return [encode(prompt)]
    if is_ids(prompt) and prompt:           # ([]: no prompt at all)
        return [prompt]
    if isinstance(prompt, list) and prompt and (all(isinstance(p, str) for p in prompt)
                                                or all(map(is_ids, prompt))):
        return [encode(p) if isinstance(p, str) else p for p in prompt]
    if prompt is None:
        raise ApiError("Missing required parameter: 'prompt'.", param="prompt")
    if prompt == []:
        raise ApiError("The prompt is empty.", param="prompt")
    raise _invalid("prompt", "a string, a list of token ids, or a non-empty list of strings or "
                   "of token-id lists", prompt)


def _logprobs(fields, served: ServedModel, chat: bool) -> int | None:
    """The alternatives per token a request asks log probabilities for, or None: completions'
    `logprobs` N; chat's `logprobs` true with `top_logprobs` N (0 without it)."""
    if chat:
        want, top = fields.get("logprobs", False), fields.get("top_logprobs")
        if not isinstance(want, bool):
            raise _invalid("logprobs", "a boolean", want)
        if top is not None and not (_is_int(top) and 0 <= top <= MAX_TOP_LOGPROBS):
            raise _invalid("top_logprobs", f"an integer in [0, {MAX_TOP_LOGPROBS}]", top)
        if top is not None and not want:
            raise ApiError("'top_logprobs' needs 'logprobs' true.", param="top_logprobs")
        n, param = (top or 0) if want else None, "top_logprobs" if top else "logprobs"
    else:
        n, param = fields.get("logprobs"), "logprobs"
        if n is not None and not (_is_int(n) and 0 <= n <= MAX_TOP_LOGPROBS):
            raise _invalid("logprobs", f"an integer in [0, {MAX_TOP_LOGPROBS}]", n)
    if n is None:
        return None
    if served.max_logprobs is None:
        raise ApiError("This server computes no log probabilities; start it with "
                       "--max-logprobs N.", param=param, code="unsupported_parameter")
    if n > served.max_logprobs:
        raise ApiError(f"'{param}' = {n}: this server lists at most {served.max_logprobs} "
                       f"alternatives per token (--max-logprobs).", param=param)
    return n


def parse_completion(body, served: ServedModel, encode: Callable[[str], list]) -> list:
    """A /v1/completions body -> its choices' GenerationParams (module docstring), in choice
    order. `prompt`: see `_prompts`."""
    fields = _checked_fields(body, COMPLETION_FIELDS)
    check_model(fields["model"], served)
    logprobs = _logprobs(fields, served, chat=False)
    choices = _choices(fields, _prompts(fields.get("prompt"), encode), served,
                       max_tokens_field="max_tokens", prompt_field="prompt",
                       default_max_tokens=COMPLETIONS_MAX_TOKENS)
    return [dataclasses.replace(c, logprobs=logprobs) for c in choices]


def _message(m, i) -> dict:
    """One chat message as the template gets it: text content (a string; text parts joined
    by newlines; null for an assistant message without text), the other keys as given."""
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise _invalid(where, "an object with 'role' and 'content'", m)
    role = m.get("role")
    if role not in ROLES:
        raise ApiError(f"Invalid value for '{where}.role': expected one of "
                       f"{', '.join(ROLES)}, got {_shown(role)}.", param=f"{where}.role")
    content = m.get("content")
    if isinstance(content, list):
        parts = []
        for j, p in enumerate(content):
            if not (isinstance(p, dict) and p.get("type") == "text"
                    and isinstance(p.get("text"), str)):
                raise ApiError(f"'{where}.content[{j}]': only text parts "
                               f"({{\"type\": \"text\", \"text\": ...}}) are supported.",
                               param=f"{where}.content")
            parts.append(p["text"])
        content = "\n".join(parts)
    elif not (isinstance(content, str) or (content is None and role == "assistant")):
        raise _invalid(f"{where}.content", "a string or a list of text parts", content)
    out = {**m, "content": content}
    if m.get("tool_calls") is not None:
        if role != "assistant":
            raise ApiError(f"'{where}.tool_calls': only assistant messages call tools.",
                           param=f"{where}.tool_calls")
        try:
            out["tool_calls"] = history_calls(m["tool_calls"], f"{where}.tool_calls")
        except ToolError as e:
            raise ApiError(str(e), param=e.param) from None
    return out


def _template_kwargs(fields) -> dict:
    """chat_template_kwargs, refusing the variables the server sets itself (the template would
    not see the request's values: a silent change of the prompt)."""
    kwargs = fields.get("chat_template_kwargs", {})
    for key, field in (("messages", "conversation"), ("tools", "tools")):
        if key in kwargs:
            raise ApiError(f"'chat_template_kwargs' cannot set '{key}'; give the {field} as "
                           f"the request's '{key}'.", param="chat_template_kwargs")
    if (v := kwargs.get("add_generation_prompt", True)) is not True:
        raise ApiError(f"'chat_template_kwargs.add_generation_prompt' = {_json(v)} is not "
                       f"supported by this server (only true: the reply follows the template's "
                       f"generation prompt).", param="chat_template_kwargs",
                       code="unsupported_parameter")
    return kwargs


def parse_chat(body, served: ServedModel, render: Callable[[list, dict], str],
               encode: Callable[[str], list], tool_format: str | None = None,
               reasoning: bool = False) -> list:
    """A /v1/chat/completions body -> its n choices' GenerationParams. `render(messages,
    kwargs)` applies the chat template (ApiError when the template refuses), `encode` tokenizes
    its text; `tool_format`: the template's tool-call format (`tools.template_format`; None:
    it renders no tools, and a request with tools is refused); `reasoning`: split the replies'
    thinking off (`reasoning.template_thinks`)."""
    fields = _checked_fields(body, CHAT_FIELDS)
    check_model(fields["model"], served)
    messages = fields.get("messages")
    if messages is None:
        raise ApiError("Missing required parameter: 'messages'.", param="messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages", "a non-empty list of messages", messages)
    try:
        tools = check_tools(fields.get("tools"), fields.get("tool_choice", "auto"),
                            fields.get("parallel_tool_calls", True), tool_format)
    except ToolError as e:
        raise ApiError(str(e), param=e.param) from None
    logprobs = _logprobs(fields, served, chat=True)
    kwargs = _template_kwargs(fields)
    if tools is not None:
        kwargs = {**kwargs, "tools": list(tools.specs)}
    text = render([_message(m, i) for i, m in enumerate(messages)], kwargs)
    if tools is not None and tools.forced:      # a forced call: the reply begins with it
        text += ("\n" + CLOSE + "\n\n" if open_after(text) else "") + tools.forced
    ids = encode(text)
    if "max_tokens" in fields and "max_completion_tokens" in fields:
        raise ApiError("Give one of 'max_tokens' and 'max_completion_tokens', not both.",
                       param="max_completion_tokens")
    key = "max_tokens" if "max_tokens" in fields else "max_completion_tokens"
    choices = _choices(fields, [ids], served, max_tokens_field=key, prompt_field="messages")
    thinking = open_after(text) if reasoning else None
    return [dataclasses.replace(c, tools=tools, thinking=thinking, logprobs=logprobs)
            for c in choices]


# ---------------------------------------------------------------------- response shapes

def _logprob(v: float) -> float:
    return max(v, -9999.0)      # OpenAI's floor (JSON has no -inf)


def chat_logprobs(entries, spell: Callable[[int], str], top: int) -> dict:
    """A chat choice's `logprobs` of its tokens `entries` [(id, logprob, ((id, logprob), ...))]
    with `top` alternatives each; spell(id) is a token's text."""
    def one(i, lp):
        text = spell(i)
        return {"token": text, "logprob": _logprob(lp), "bytes": list(text.encode())}
    return {"content": [{**one(t, lp), "top_logprobs": [one(i, a) for i, a in alts[:top]]}
                        for t, lp, alts in entries], "refusal": None}


def completion_logprobs(entries, spell: Callable[[int], str], top: int,
                        offset: int = 0) -> dict:
    """A completion choice's `logprobs` (the legacy shape) of `entries` (as `chat_logprobs`'):
    each token's text, its logprob, the `top` alternatives and the sampled token by text, and
    where its text starts (from `offset`, the length of the text before these tokens)."""
    tokens = [spell(t) for t, _, _ in entries]
    tops = [{**{spell(i): _logprob(a) for i, a in alts[:top]}, tokens[n]: _logprob(lp)}
            for n, (_, lp, alts) in enumerate(entries)]
    return {"tokens": tokens, "token_logprobs": [_logprob(lp) for _, lp, _ in entries],
            "top_logprobs": tops,
            "text_offset": list(itertools.accumulate(map(len, tokens), initial=offset))[:-1]}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage object; cached_tokens: prompt tokens served from the prefix cache."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


@dataclasses.dataclass(frozen=True)
class Reply:
    """The response and chunk shapes of one request (chat or text completion)."""
    chat: bool
    model: str
    id: str = ""
    created: int = 0

    @classmethod
    def new(cls, chat: bool, model: str) -> Reply:
        prefix = "chatcmpl" if chat else "cmpl"
        return cls(chat, model, f"{prefix}-{uuid.uuid4().hex}", int(time.time()))

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion" if self.chat else "text_completion") + \
            (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def response(self, choices: list, use: dict) -> dict:
        """The whole answer: choices [(text, finish_reason, tool_calls, reasoning, logprobs)] in
        index order (chat: content None beside tool calls without text; tool_calls [] and
        reasoning None: none; logprobs: `chat_logprobs` / `completion_logprobs` or None)."""
        out = []
        for i, (text, finish_reason, calls, reasoning, logprobs) in enumerate(choices):
            if self.chat:
                message = {"role": "assistant", "content": text}
                if reasoning is not None:
                    message["reasoning_content"] = reasoning
                if calls:
                    message["tool_calls"] = calls
                choice = {"index": i, "message": message}
            else:
                choice = {"index": i, "text": text}
            choice.update(logprobs=logprobs, finish_reason=finish_reason)
            out.append(choice)
        return {**self._head(False), "choices": out, "usage": use}

    def chunk(self, text: str = "", finish_reason: str | None = None,
              first: bool = False, index: int = 0, tool_calls: list | None = None,
              reasoning: str = "", logprobs: dict | None = None) -> dict:
        """A stream chunk of choice `index` with `text`; `first` (chat): the one that opens
        the assistant message; `finish_reason`: the choice's last one; `tool_calls` (chat):
        [(j, call)], whole calls with their index j among the choice's calls; `reasoning`
        (chat): a piece of thinking; `logprobs`: those of the tokens since the last chunk."""
        if self.chat:
            delta = ({"role": "assistant", "content": text} if first else
                     {"content": text} if text or finish_reason is None else {})
            if tool_calls:
                delta = {"tool_calls": [{"index": j, **c} for j, c in tool_calls]}
            elif reasoning:
                delta = {"reasoning_content": reasoning}
            choice = {"index": index, "delta": delta}
        else:
            choice = {"index": index, "text": text}
        choice.update(logprobs=logprobs, finish_reason=finish_reason)
        return {**self._head(True), "choices": [choice]}

    def usage_chunk(self, use: dict) -> dict:
        """The chunk after the last one when stream_options.include_usage: no choices."""
        return {**self._head(True), "choices": [], "usage": use}
