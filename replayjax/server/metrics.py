"""The server's Prometheus metrics (prometheus-client, one registry per server), exposed as text
at GET /metrics. Names start with `replayjax_`."""

from __future__ import annotations

import threading
import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

RATE_WINDOW_S = 10.0          # tokens per second: over the last this many seconds
_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
                    2.5, 5.0, 10.0, 20.0, 40.0, 80.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """Counters, gauges and histograms of one server. `load()` -> (queued, running, slots) is read
    at every scrape."""

    def __init__(self, load, num_draft: int):
        self.registry = r = CollectorRegistry()
        self.num_draft = num_draft
        Gauge("replayjax_queue_depth", "Requests waiting for a slot", registry=r
              ).set_function(lambda: load()[0])
        Gauge("replayjax_running_slots", "Slots holding a request", registry=r
              ).set_function(lambda: load()[1])
        Gauge("replayjax_slots", "Slots in the engine", registry=r
              ).set_function(lambda: load()[2])
        self.ttft = Histogram("replayjax_time_to_first_token_seconds",
                              "Request arrival to its first token", buckets=_LATENCY_BUCKETS,
                              registry=r)
        self.itl = Histogram("replayjax_inter_token_latency_seconds",
                             "Time between two tokens of a request (a host visit's tokens share "
                             "its interval)", buckets=_LATENCY_BUCKETS, registry=r)
        self.latency = Histogram("replayjax_request_latency_seconds",
                                 "Request arrival to its last token", buckets=_LATENCY_BUCKETS,
                                 registry=r)
        self.prompt_tokens = Counter("replayjax_prompt_tokens", "Prompt tokens of admitted "
                                     "requests", registry=r)
        self.generated = Counter("replayjax_generation_tokens", "Tokens generated", registry=r)
        Gauge("replayjax_generation_tokens_per_second",
              f"Tokens generated per second over the last {RATE_WINDOW_S:g} s", registry=r
              ).set_function(self._rate)
        self.drafts = Counter("replayjax_draft_tokens", "Draft tokens proposed (speculative "
                              "decoding)", registry=r)
        self.accepted = Counter("replayjax_accepted_draft_tokens", "Draft tokens accepted",
                                registry=r)
        Gauge("replayjax_draft_acceptance_rate", "Accepted / proposed draft tokens so far",
              registry=r).set_function(self._acceptance)
        self.finished = Counter("replayjax_requests", "Finished requests (each choice of a "
                                "request with several prompts or n > 1 counts) by finish reason "
                                "(stop, length, abort: server shutdown, cancelled: the client "
                                "went away, error: the engine could not serve it)",
                                ["finish_reason"], registry=r)
        self.rejected = Counter("replayjax_rejected_requests", "Requests refused, by reason "
                                "(an OpenAI error code or type)", ["reason"], registry=r)
        self.prefix_lookup = Counter("replayjax_prefix_cache_lookup_tokens", "Prompt tokens "
                                     "of prefilled requests (looked up in the prefix cache)",
                                     registry=r)
        self.prefix_hit = Counter("replayjax_prefix_cache_hit_tokens", "Prompt tokens restored "
                                  "from the prefix cache instead of prefilled", registry=r)
        Gauge("replayjax_prefix_cache_hit_rate", "Prefix-cache hit tokens / lookup tokens so "
              "far", registry=r).set_function(self._hit_rate)
        self._lock = threading.Lock()
        self._recent = deque()            # (time, tokens) of the last RATE_WINDOW_S
        self._proposed = self._accepted = 0
        self._looked = self._hit = 0

    def tokens(self, n: int, now: float) -> None:
        """`n` tokens of a request arrived at `now` (time.monotonic())."""
        self.generated.inc(n)
        with self._lock:
            self._recent.append((now, n))

    def speculation(self, verify_steps: int, accepted: int) -> None:
        """A finished request's speculative steps and accepted drafts."""
        with self._lock:
            self._proposed += verify_steps * self.num_draft
            self._accepted += accepted
        self.drafts.inc(verify_steps * self.num_draft)
        self.accepted.inc(accepted)

    def prefix(self, prompt_tokens: int, cached_tokens: int) -> None:
        """A prefilled request's prompt tokens and those the prefix cache restored."""
        with self._lock:
            self._looked += prompt_tokens
            self._hit += cached_tokens
        self.prefix_lookup.inc(prompt_tokens)
        self.prefix_hit.inc(cached_tokens)

    def _hit_rate(self) -> float:
        with self._lock:
            return self._hit / self._looked if self._looked else 0.0

    def _rate(self) -> float:
        now = time.monotonic()
        with self._lock:
            while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
                self._recent.popleft()
            return sum(n for _, n in self._recent) / RATE_WINDOW_S

    def _acceptance(self) -> float:
        with self._lock:
            return self._accepted / self._proposed if self._proposed else 0.0

    def text(self) -> bytes:
        return generate_latest(self.registry)
