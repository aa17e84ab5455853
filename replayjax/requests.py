"""What goes into the engine and what comes out: a `Request`, the `Event`s of each host visit, a
`Completion` per finished request, and `check_request`, the rules a request must pass before the
engine queues it (a `RequestError` naming the request, the field and the rule otherwise)."""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence

import numpy as np

from pallas_kernels.validation import is_int
from replayjax.sampling import SamplingParams

MAX_TOP_LOGPROBS = 20       # most likely tokens listed with a token's log probability (OpenAI's)


@dataclasses.dataclass
class Request:
    prompt: Sequence[int]                   # token ids, non-empty
    max_new_tokens: int = 32
    stop_ids: Sequence[int] = ()            # the first one generated ends the request (kept)
    sampling: SamplingParams = SamplingParams()
    id: Hashable = None                     # None: the engine assigns one


@dataclasses.dataclass
class Completion:
    id: Hashable
    tokens: list
    finish_reason: str              # "stop" | "length" | "cancelled" | "error" (see `error`)
    ttft_s: float                   # submission to first token (nan if it got none)
    completion_s: float             # submission to last token (or to the cancellation)
    verify_steps: int = 0           # speculative steps this request took part in
    accepted_drafts: int = 0
    drafts: list = dataclasses.field(default_factory=list)  # (cache length, drafts) per spec
                                                            # step, with Engine.record_drafts
    logits: np.ndarray | None = None  # [len(tokens), V] fp32, with Engine(return_logits=True)
    cached_tokens: int = 0          # prompt tokens restored from the prefix cache (not prefilled)
    error: str = ""                 # finish_reason "error": why (its prefill failed before it
                                    # ran; the engine goes on)
    logprobs: list | None = None    # per token (logprob, ((id, logprob), ...)), Engine(logprobs=K)

    @property
    def tpot_s(self):
        """Mean time per output token after the first."""
        return (self.completion_s - self.ttft_s) / max(len(self.tokens) - 1, 1)


@dataclasses.dataclass(frozen=True)
class Event:
    """What one host visit did to one request: its new tokens (already cut at a stop id or
    max_new_tokens; a request's events concatenate to its Completion.tokens) and, when it
    finished at this visit, its Completion."""
    id: Hashable
    tokens: list
    completion: Completion | None = None
    cached: int = 0         # prompt tokens the prefix cache restored (known once prefilled)
    logprobs: list | None = None    # its tokens' (logprob, ((id, logprob), ...)), Engine(logprobs)

    @property
    def finished(self) -> bool:
        return self.completion is not None


class RequestError(ValueError):
    """A request the engine cannot serve (named field and limit in the message)."""


def check_request(r: Request, *, vocab: int, max_len: int, num_draft: int) -> None:
    """RequestError unless `r` can be served by an engine with this vocabulary, cache length and
    number of drafts per speculative step."""
    def fail(why):
        raise RequestError(f"request {r.id!r}: {why}")

    if not isinstance(r.id, Hashable):
        raise RequestError(f"request id must be hashable, got a {type(r.id).__name__}")
    prompt = _token_ids(r.prompt, "prompt", fail)
    if prompt.size == 0:
        fail("empty prompt")
    _in_vocab(prompt, "token ids", vocab, fail)
    stops = _token_ids(list(r.stop_ids) if isinstance(r.stop_ids, (set, frozenset))
                       else r.stop_ids, "stop_ids", fail)
    _in_vocab(stops, "stop_ids", vocab, fail)
    n = r.max_new_tokens
    if not is_int(n):
        fail(f"max_new_tokens must be an integer, got {n!r}")
    if n < 1:
        fail(f"max_new_tokens must be >= 1, got {n}")
    need = prompt.size + n + num_draft
    if need > max_len:
        fail(f"prompt ({prompt.size}) + max_new_tokens ({n}) + drafts ({num_draft}) = {need} "
             f"exceeds the cache length max_len = {max_len}")
    if not isinstance(r.sampling, SamplingParams):
        fail(f"sampling must be a SamplingParams, got a {type(r.sampling).__name__}")
    try:
        r.sampling.check()
    except ValueError as e:
        fail(str(e))


def _token_ids(ids, field, fail) -> np.ndarray:
    """ids as a 1-D integer array, or fail naming the field."""
    try:
        arr = np.asarray(ids)
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        fail(f"{field} must be a sequence of integer token ids, got {ids!r:.80}")
    return arr


def _in_vocab(ids: np.ndarray, what, vocab, fail) -> None:
    bad = ids[(ids < 0) | (ids >= vocab)]
    if bad.size:
        fail(f"{what} {bad[:5].tolist()} out of the vocabulary [0, {vocab})")
