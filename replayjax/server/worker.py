"""The engine thread: steps the engine while requests arrive (continuous batching) and hands each
request's events to the callback it was submitted with."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable

from replayjax.engine import Engine, Event, Request

log = logging.getLogger("replayjax.server")

IDLE_POLL_S = 0.1         # how often an idle engine thread checks whether it should stop


class EngineFailed(RuntimeError):
    """The engine raised while stepping; the server cannot serve any more."""
    status, code = 503, "engine_failed"


class RequestFailed(EngineFailed):
    """The engine could not serve one request (its prefill failed before it ran) and goes on
    serving the others."""
    status, code = 500, "request_failed"


class EngineWorker:
    """Runs `engine.step()` in one thread. `submit` and `cancel` may be called from any thread;
    a request's `deliver(event)` is called in the engine thread with each of its `Event`s, the
    last one carrying its Completion, or once with an EngineFailed if the engine breaks."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.failed: EngineFailed | None = None
        self._sinks: dict[Hashable, Callable] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replayjax-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stops the thread after its current host visit."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, request: Request, deliver: Callable) -> None:
        """Queues `request` (it must carry its id); RequestError if the engine refuses it."""
        if self.failed:
            raise self.failed
        with self._lock:
            self._sinks[request.id] = deliver        # before the engine can produce events
        try:
            self.engine.submit(request)
        except BaseException:
            with self._lock:
                del self._sinks[request.id]
            raise

    def cancel(self, request_id: Hashable) -> None:
        """Cancels a queued or running request (its last event comes at the next host visit,
        with finish_reason "cancelled"); nothing if it has finished."""
        self.engine.cancel(request_id)

    def in_flight(self) -> list:
        """Ids of the requests submitted and not finished."""
        with self._lock:
            return list(self._sinks)

    def load(self) -> tuple[int, int, int]:
        """(requests queued, slots running, slots)."""
        e = self.engine
        return e.num_queued, e.num_running, e.num_slots

    def _run(self):
        try:
            while not self._stop.is_set():
                if self.engine.wait_for_work(IDLE_POLL_S):
                    self._dispatch(self.engine.step())
        except Exception as e:                  # noqa: BLE001 -- reported to every request
            log.exception("the engine failed; no further requests can be served")
            self.failed = EngineFailed(f"the engine failed ({type(e).__name__}: {e})")
            with self._lock:
                sinks, self._sinks = list(self._sinks.values()), {}
            for deliver in sinks:
                self._call(deliver, self.failed)

    def _dispatch(self, events: list[Event]):
        for ev in events:
            with self._lock:
                deliver = (self._sinks.pop(ev.id, None) if ev.finished else
                           self._sinks.get(ev.id))
            if deliver is not None:
                failed = ev.finished and ev.completion.finish_reason == "error"
                self._call(deliver, RequestFailed(ev.completion.error) if failed else ev)

    @staticmethod
    def _call(deliver, item):
        try:
            deliver(item)
        except RuntimeError:          # the receiving event loop has closed (shutdown)
            pass
