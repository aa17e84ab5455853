"""Benchmark requests: JSONL traces (validated line by line), synthetic workloads with mixed or
equal prompt lengths, and arrival schedules.

Trace format, one request per line (blank lines skipped):

    {"prompt_ids": [1, 5, 9], "max_new_tokens": 64}
    {"prompt": "text", "max_new_tokens": 64, "temperature": 0.7, "top_k": 50, "top_p": 0.9,
     "seed": 1, "stop_ids": [2], "id": "req-7"}
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import numpy as np

from replayjax import memory
from replayjax.commandline import INT32_MAX, UserError, is_unicode

TRACE_FIELDS = ("prompt_ids", "prompt", "max_new_tokens", "temperature", "top_k", "top_p",
                "seed", "stop_ids", "id")
WORKLOADS = ("mixed", "sync", "agents")
WORKLOAD_HELP = ("synthetic prompts: mixed (lengths log-uniform in [P/4, 4P]), sync (all P) or "
                 "agents (turns of agents sharing a system prompt of P tokens, each turn "
                 "extending its agent's history: what a prefix cache saves)")
MIXED_SPREAD = 4        # mixed prompt lengths are log-uniform in [P / 4, 4 P] (geometric mean P)
AGENT_TURNS = 4         # agents workload: turns per agent
AGENT_MESSAGE = 8       # agents workload: a user message is prompt_len / 8 tokens
ARRIVALS = ("staggered", "burst", "poisson", "uniform")
HOST_BYTES_PER_TOKEN = 80   # a prompt token on the host: its int object, tuple and list slots


@dataclasses.dataclass(frozen=True)
class TraceRequest:
    """One benchmark request; `where` ("FILE:LINE" or "synthetic") names it in errors."""
    where: str
    prompt: tuple
    max_new_tokens: int
    stop_ids: tuple = ()
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    id: object = None
    prompt_field: str = "prompt_ids"      # or "prompt" (text), for error messages

    def request(self, max_new_tokens=None):
        """A fresh engine Request (the engine fills in ids, so variants must not share them)."""
        from replayjax.engine import Request, SamplingParams
        return Request(prompt=list(self.prompt),
                       max_new_tokens=max_new_tokens or self.max_new_tokens,
                       stop_ids=self.stop_ids, id=self.id,
                       sampling=SamplingParams(self.temperature, self.top_k, self.top_p, self.seed))


class TraceError(UserError, ValueError):
    """A trace the bench cannot serve; the message names the file, line and field."""


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)     # JSON true is not a token id


def _is_number(x):
    return (_is_int(x) or isinstance(x, float)) and math.isfinite(x)


def _field_error(where, field, why):
    return TraceError(f"{where}: field {field!r} {why}")


def _int_list(obj, field, where, allow_empty):
    ids = obj[field]
    if not isinstance(ids, list) or not all(_is_int(t) for t in ids):
        raise _field_error(where, field, f"must be a list of integer token ids, got {ids!r:.80}")
    if not ids and not allow_empty:
        raise _field_error(where, field, "is empty")
    return tuple(ids)


def _checked(obj, field, where, ok, want, default):
    """obj[field] if present and ok(value), else `default` when absent; TraceError otherwise."""
    if field not in obj:
        return default
    if not ok(obj[field]):
        raise _field_error(where, field, f"must be {want}, got {obj[field]!r:.80}")
    return obj[field]


def parse_trace_line(line, where, encode):
    """One JSONL line -> TraceRequest. `encode(text, where)` tokenizes text prompts. Token ids are
    checked against the vocabulary later (`check_vocab`), once the model is known."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise TraceError(f"{where}: not valid JSON ({e.msg}, column {e.colno})") from None
    except RecursionError:
        raise TraceError(f"{where}: the JSON nests too deeply") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if unknown := sorted(set(obj) - set(TRACE_FIELDS)):
        raise TraceError(f"{where}: unknown field(s) {unknown} (known: {', '.join(TRACE_FIELDS)})")
    if ("prompt" in obj) == ("prompt_ids" in obj):
        raise TraceError(f"{where}: give exactly one of 'prompt_ids' (token ids) or 'prompt' "
                         f"(text)")
    if "prompt" in obj:
        text = _checked(obj, "prompt", where, lambda v: isinstance(v, str) and v != "" and
                        is_unicode(v), "a non-empty string of valid Unicode (no lone surrogate "
                        "escape such as \\ud800)", None)
        prompt, prompt_field = tuple(encode(text, where)), "prompt"
        if not prompt:
            raise _field_error(where, "prompt", "encodes to no tokens")
    else:
        prompt, prompt_field = _int_list(obj, "prompt_ids", where, allow_empty=False), "prompt_ids"
    if "max_new_tokens" not in obj:
        raise TraceError(f"{where}: missing field 'max_new_tokens'")
    return TraceRequest(
        where=where, prompt=prompt, prompt_field=prompt_field,
        max_new_tokens=_checked(obj, "max_new_tokens", where, lambda v: _is_int(v) and v >= 1,
                                "an integer >= 1", None),
        stop_ids=_int_list(obj, "stop_ids", where, True) if "stop_ids" in obj else (),
        temperature=float(_checked(obj, "temperature", where, lambda v: _is_number(v) and v >= 0,
                                   "a number >= 0 (0 = greedy)", 0.0)),
        top_k=_checked(obj, "top_k", where, lambda v: _is_int(v) and 0 <= v <= INT32_MAX,
                       "an integer in [0, 2^31) (0 = off)", 0),        # int32 on device
        top_p=float(_checked(obj, "top_p", where, lambda v: _is_number(v) and 0 < v <= 1,
                             "a number in (0, 1]", 1.0)),
        seed=_checked(obj, "seed", where, lambda v: _is_int(v) and 0 <= v <= INT32_MAX,
                      "an integer in [0, 2^31)", 0),        # the engine keys int32 seeds
        id=_checked(obj, "id", where, lambda v: isinstance(v, (str, int, float)),
                    "a string or a number", where))


def text_encoder(tokenizer_path):
    """`encode(text, where)` -> token ids, loading the tokenizer on first use (id-only traces
    need neither the file nor the `tokenizers` package)."""
    loaded = []

    def tokenizer(where):
        if tokenizer_path is None:
            raise TraceError(f"{where}: field 'prompt' (text) needs a tokenizer: --model DIR with "
                             f"a tokenizer.json, or --tokenizer FILE; or use 'prompt_ids'")
        if not os.path.isfile(tokenizer_path):
            raise TraceError(f"{where}: field 'prompt' (text) needs {tokenizer_path}, which does "
                             f"not exist (give --tokenizer FILE, or use 'prompt_ids')")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TraceError(f"{where}: text prompts need the 'tokenizers' package (pip install "
                             f"tokenizers); or use 'prompt_ids'") from None
        try:
            return Tokenizer.from_file(tokenizer_path)
        except Exception as e:      # noqa: BLE001 -- the library raises plain Exceptions
            raise TraceError(f"{tokenizer_path}: not a valid tokenizer.json "
                             f"({' '.join(str(e).split())[:120]})") from None

    def encode(text, where):
        if not loaded:
            loaded.append(tokenizer(where))
        return loaded[0].encode(text).ids

    return encode


def load_trace(path, tokenizer_path=None, encode=None):
    """The requests of a JSONL trace, every line validated (TraceError names file:line, field).
    Text prompts go through `encode(text, where)` (default: the tokenizer at tokenizer_path)."""
    encode = encode or text_encoder(tokenizer_path)
    try:
        with open(path, encoding="utf-8") as f:
            reqs = [parse_trace_line(line, f"{path}:{n}", encode)
                    for n, line in enumerate(f, 1) if line.strip()]
    except OSError as e:
        raise TraceError(f"cannot read trace {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not UTF-8 text ({e.reason})") from None
    if not reqs:
        raise TraceError(f"{path}: no requests (one JSON object per line)")
    first = {}
    for r in reqs:          # a line without an id is named by its file:line, unique
        if (seen := first.setdefault(r.id, r.where)) != r.where:
            raise _field_error(r.where, "id", f"{r.id!r} is already the id of {seen}")
    return reqs


def check_vocab(reqs, vocab):
    """TraceError for the first request with a prompt or stop id outside [0, vocab) (a text
    prompt's means the tokenizer does not belong to the model)."""
    for r in reqs:
        for field, ids in ((r.prompt_field, r.prompt), ("stop_ids", r.stop_ids)):
            if bad := [t for t in ids if not 0 <= t < vocab]:
                raise _field_error(r.where, field, f"has token ids {bad[:5]} outside the model's "
                                                   f"vocabulary [0, {vocab})")


def synthetic_requests(n: int, prompt_len: int, new_tokens: int, vocab: int, *, seed: int = 0,
                       workload: str = "mixed") -> list[TraceRequest]:
    """`n` greedy requests of random prompt ids (>= 3: clear of pad/bos/eos) generating
    `new_tokens` each. workload "mixed": prompt lengths log-uniform in
    [prompt_len / MIXED_SPREAD, prompt_len * MIXED_SPREAD] (seeded; a serving mix of short and long
    prompts, so prefill buckets, KV lengths and finishing times differ across rows); "sync": all
    `prompt_len` long (the synchronous equal-length case); "agents": `agent_requests` (shared
    prefixes, for the prefix cache). UserError if they would not fit in the host's memory."""
    if workload == "agents":
        return agent_requests(n, prompt_len, new_tokens, vocab, seed=seed)
    longest = prompt_len if workload == "sync" else prompt_len * MIXED_SPREAD
    if why := memory.shortfall(n * longest * HOST_BYTES_PER_TOKEN, host=True):
        raise UserError(f"{n} synthetic prompts of up to {longest} tokens {why}")
    rng = np.random.default_rng(seed)
    if workload == "sync":
        lengths = np.full(n, prompt_len)
    else:
        lo, hi = max(1, prompt_len / MIXED_SPREAD), prompt_len * MIXED_SPREAD
        lengths = np.rint(np.exp(rng.uniform(np.log(lo), np.log(hi), n))).astype(int)
    return [TraceRequest("synthetic", tuple(rng.integers(3, vocab, int(m)).tolist()), new_tokens,
                         id=i) for i, m in enumerate(lengths)]


def agent_requests(n: int, system_len: int, new_tokens: int, vocab: int, *, seed: int = 0,
                   turns: int = AGENT_TURNS) -> list[TraceRequest]:
    """`n` requests of ceil(n / turns) agents in multi-turn conversations, turn-major (every
    agent's turn 0, then turn 1, ...; give them increasing arrival times): all share a system
    prompt of `system_len` tokens; turn t's prompt is the system prompt, then per earlier turn
    a user message (system_len / AGENT_MESSAGE tokens, >= 1) and a reply of `new_tokens`
    tokens (random, standing for that turn's completion), then turn t's user message. So a
    turn's prompt extends the agent's previous one, and every prompt starts with the system
    prompt. Deterministic in `seed`; UserError if it would not fit in the host's memory."""
    agents, msg = -(-n // turns), max(1, system_len // AGENT_MESSAGE)
    longest = system_len + turns * (msg + new_tokens)
    if why := memory.shortfall(n * longest * HOST_BYTES_PER_TOKEN, host=True):
        raise UserError(f"{n} agent prompts of up to {longest} tokens {why}")
    rng = np.random.default_rng(seed)
    ids = lambda k: tuple(rng.integers(3, vocab, k).tolist())
    system = ids(system_len)
    history = [system] * agents
    out = []
    for i in range(n):
        t, a = divmod(i, agents)
        if t:
            history[a] += ids(new_tokens)        # the previous turn's reply
        history[a] += ids(msg)
        out.append(TraceRequest("synthetic", history[a], new_tokens, id=i))
    return out


def arrival_times(n: int, rate: float | None = None, pattern: str = "burst", seed: int = 0,
                  span: int = 1) -> np.ndarray:
    """When each of `n` requests arrives, in request order. "staggered": at a host visit of the
    engine drawn uniformly from [0, span) (seeded; request 0 at visit 0): a serving batch whose
    rows start, and so fold, at different steps, the same on any hardware; "burst": all at 0;
    "poisson": a Poisson process of `rate` requests/s (exponential gaps, seeded, the first at 0);
    "uniform": one every 1 / `rate` s. Visits for "staggered", seconds for the others
    (`arrival_unit`)."""
    if pattern == "burst":
        return np.zeros(n)
    if pattern == "staggered":
        visits = np.random.default_rng(seed).integers(0, max(span, 1), n)
        visits[:1] = 0
        return visits.astype(float)
    if pattern not in ARRIVALS or not rate or rate <= 0:
        raise ValueError(f"arrivals {pattern!r} need a rate > 0 (patterns: {ARRIVALS})")
    if pattern == "uniform":
        return np.arange(n) / rate
    gaps = np.random.default_rng(seed).exponential(1 / rate, n)
    return np.concatenate([[0.0], np.cumsum(gaps[1:])])


def arrival_unit(pattern: str) -> str:
    """"visit" for staggered arrivals (engine host visits), "s" (seconds) for the others."""
    return "visit" if pattern == "staggered" else "s"


@dataclasses.dataclass(frozen=True)
class Workload:
    """The requests of a run and when each arrives (from the start, in `unit`: "s" seconds or
    "visit" engine host visits; all 0 = one burst). Every variant serves the same workload."""
    requests: tuple
    arrivals: tuple
    description: str
    unit: str = "s"

    @property
    def kv_len(self) -> float:
        """Mean tokens in a row's cache over its decode steps: prompt + (new tokens - 1) / 2."""
        return float(np.mean([len(r.prompt) + (r.max_new_tokens - 1) / 2
                              for r in self.requests]))

    @property
    def max_len(self) -> int:
        return max(len(r.prompt) + r.max_new_tokens for r in self.requests)
