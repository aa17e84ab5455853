"""One request in flight, seen from its HTTP handler: submitted to the engine thread, its events
turned into text pieces (detokenized, cut at stop strings) until it finishes."""

from __future__ import annotations

import asyncio
import time

from replayjax.engine import Event, Request
from replayjax.server.metrics import Metrics
from replayjax.server.protocol import GenerationParams
from replayjax.server.text import Detokenizer, StopStrings
from replayjax.server.worker import EngineFailed, EngineWorker, RequestFailed


class Generation:
    """Runs `params` on the engine as request `rid`. `start()` submits it (RequestError if the
    engine refuses it); `pieces()` yields its text as it comes and leaves `finish_reason`
    ("stop", "length", "abort": cancelled by the server, "cancelled": the client went away)
    and the token counts."""

    def __init__(self, rid: str, params: GenerationParams, worker: EngineWorker, tokenizer,
                 metrics: Metrics):
        self.id, self.params, self.worker, self.metrics = rid, params, worker, metrics
        self.detok = Detokenizer(tokenizer, params.prompt)
        self.stops = StopStrings(params.stop)
        self.prompt_tokens = len(params.prompt)
        self.completion_tokens = 0
        self.token_logprobs = []                # (id, logprob, alternatives) of counted tokens
        self._logprobs_sent = 0
        self.cached_tokens = 0                  # prompt tokens the prefix cache restored
        self.finish_reason: str | None = None
        self.aborted = False                    # the server cancelled it (shutdown)
        self._engine_done = False               # the engine reported its completion
        self._events: asyncio.Queue | None = None
        self._arrived = self._last = time.monotonic()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._events = asyncio.Queue()
        p = self.params
        self.worker.submit(Request(prompt=p.prompt, max_new_tokens=p.max_tokens,
                                   stop_ids=p.stop_ids, sampling=p.sampling, id=self.id),
                           lambda item: loop.call_soon_threadsafe(self._events.put_nowait, item))
        self.metrics.prompt_tokens.inc(self.prompt_tokens)

    def abort(self) -> None:
        """Cancels it on the server's behalf: it ends with finish_reason "abort"."""
        self.aborted = True
        self.worker.cancel(self.id)

    async def pieces(self, disconnected: asyncio.Future):
        """Its text, a piece per host visit that adds some, until the request finishes. When
        `disconnected` completes first the request is cancelled (finish_reason "cancelled")
        and nothing more comes. Raises EngineFailed if the engine breaks, RequestFailed
        (finish_reason "error") if it could not serve this request."""
        try:
            while self.finish_reason is None:
                item = await self._next(disconnected)
                if item is None:
                    self._finish("cancelled")
                    return
                if isinstance(item, RequestFailed):     # the engine is done with it
                    self._engine_done = True
                    self._finish("error")
                if isinstance(item, EngineFailed):
                    raise item
                if text := self._consume(item):
                    yield text
        finally:
            if not self._engine_done:           # a stop string, the client gone, an error
                self.worker.cancel(self.id)
            if self.finish_reason is None:
                self._finish("cancelled")

    async def _next(self, disconnected) -> Event | EngineFailed | None:
        get = asyncio.ensure_future(self._events.get())
        await asyncio.wait((get, disconnected), return_when=asyncio.FIRST_COMPLETED)
        if get.done():
            return get.result()
        get.cancel()
        return None

    def _consume(self, ev: Event) -> str:
        """The text of one event's tokens; finishes the request at a stop string or when the
        engine finished it."""
        now = time.monotonic()
        if ev.tokens:
            if self.completion_tokens == 0:         # its first tokens: it was prefilled
                self.metrics.ttft.observe(now - self._arrived)
                self.cached_tokens = ev.cached
                self.metrics.prefix(self.prompt_tokens, ev.cached)
            else:
                gap = (now - self._last) / len(ev.tokens)
                for _ in ev.tokens:
                    self.metrics.itl.observe(gap)
            self._last = now
            self.metrics.tokens(len(ev.tokens), now)
        text = []
        # with stop strings token by token (the tokens past one are not counted), else at once
        n = len(ev.tokens)
        for a, b in [(i, i + 1) for i in range(n)] if self.stops.stops else [(0, n)]:
            chunk = ev.tokens[a:b]
            self.completion_tokens += len(chunk)
            if self.params.logprobs is not None and ev.logprobs is not None:
                self.token_logprobs += [(t, lp, alts) for t, (lp, alts)
                                        in zip(chunk, ev.logprobs[a:b])]
            text.append(self.stops.push(self.detok.push(*chunk)))
            if self.stops.hit:
                self._finish("stop")
                return "".join(text)
        if ev.finished:
            self._engine_done = True
            text.append(self.stops.push(self.detok.flush()))
            if self.stops.hit:
                self._finish("stop")
                return "".join(text)
            text.append(self.stops.flush())
            c = ev.completion
            if c.verify_steps:
                self.metrics.speculation(c.verify_steps, c.accepted_drafts)
            reason = c.finish_reason
            self._finish(reason if reason != "cancelled" else
                         "abort" if self.aborted else "cancelled")
        return "".join(text)

    def new_logprobs(self) -> list:
        """The (id, logprob, alternatives) of the tokens counted since the last call."""
        start, self._logprobs_sent = self._logprobs_sent, len(self.token_logprobs)
        return self.token_logprobs[start:]

    def _finish(self, reason: str) -> None:
        self.finish_reason = reason
        self.metrics.finished.labels(reason).inc()
        self.metrics.latency.observe(time.monotonic() - self._arrived)
