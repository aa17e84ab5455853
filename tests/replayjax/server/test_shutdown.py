"""`replayjax serve` limits and shutdown, on a server of its own (a real subprocess): a full
queue answers 429 with Retry-After; SIGTERM refuses new requests with 503, ends every open
stream with a final chunk (its finish_reason) and [DONE], answers a waiting non-streaming
request, and exits 0."""

import asyncio
import signal
import time

import httpx
import pytest

from tests.replayjax.server.helpers import MODEL, ServerProcess, sse_events

SHUTDOWN_TIMEOUT = 0.5
LONG = {"model": MODEL, "prompt": "This program is", "max_tokens": 240, "temperature": 0}


@pytest.fixture(scope="module")
def server(jax_cache, tmp_path_factory):
    s = ServerProcess(jax_cache, tmp_path_factory.mktemp("limits") / "stderr.log",
                      "--max-queue", "2", "--shutdown-timeout", str(SHUTDOWN_TIMEOUT))
    try:
        yield s.wait_ready()
    finally:
        s.stop()


async def _open(http, body):
    """Sends a streaming request; returns (status, response, its context) with the body unread
    (the context stays open until closed)."""
    cm = http.stream("POST", "/v1/completions", json={**body, "stream": True})
    r = await cm.__aenter__()
    if r.status_code != 200:
        await r.aread()
        await cm.__aexit__(None, None, None)
    return r, cm


def test_a_full_queue_answers_429(server):
    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            opened = await asyncio.gather(*(_open(http, LONG) for _ in range(40)))
            h = server.health()
            for r, cm in opened:
                if r.status_code == 200:
                    await cm.__aexit__(None, None, None)        # the client goes away
            return [r for r, _ in opened], h

    responses, h = asyncio.run(run())
    refused = [r for r in responses if r.status_code != 200]
    # at most the slots plus --max-queue in flight: the 32 slots take what the queue holds
    assert len(refused) == 40 - 32 - 2 and h["in_flight"] <= 32 + 2
    for r in refused:
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "queue_full"
    deadline = time.monotonic() + 30
    while (server.health()["running"], server.health()["in_flight"]) != (0, 0):
        assert time.monotonic() < deadline, server.health()
        time.sleep(0.05)


def test_sigterm_drains_and_exits_0(server):
    async def read_to_end(r, cm, lines):
        try:
            return sse_events([line async for line in lines])
        finally:
            await cm.__aexit__(None, None, None)

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            streams, first = [], []
            for _ in range(4):        # one at a time: the queue holds 2
                r, cm = await _open(http, LONG)
                streams.append((r, cm, r.aiter_lines()))
                first.append(await anext(streams[-1][2]))               # generating now
            waiting = asyncio.ensure_future(http.post("/v1/completions", json=LONG))
            while server.health()["running"] < 5:
                await asyncio.sleep(0.02)
            t0 = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            while True:        # until the drain refuses; what got in before is drained too
                r, cm = await _open(http, LONG)
                if r.status_code == 503:
                    break
                if r.status_code == 200:
                    streams.append((r, cm, r.aiter_lines()))
            events = await asyncio.gather(*(read_to_end(*s) for s in streams))
            return first, r, events, await waiting, t0

    first, refused, events, waited, t0 = asyncio.run(run())
    assert all(line.startswith("data:") for line in first)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
    reasons = []
    for ev in events:
        assert ev[-1] == "[DONE]"
        final = ev[-2]["choices"][0]
        assert final["finish_reason"] in ("length", "abort") and final["text"] == ""
        reasons.append(final["finish_reason"])
    assert "abort" in reasons          # 240 tokens take far longer than SHUTDOWN_TIMEOUT
    assert waited.status_code == 200
    assert waited.json()["choices"][0]["finish_reason"] in ("length", "abort")
    assert server.proc.wait(timeout=60) == 0, server.stderr()[-2000:]
    assert time.monotonic() - t0 < SHUTDOWN_TIMEOUT + 30
    assert "Traceback" not in server.stderr()


def test_a_second_signal_aborts_the_drain_at_once(jax_cache, tmp_path):
    """With a long --shutdown-timeout, SIGTERM then SIGINT: the streams in flight end with
    "abort" and [DONE] right away and the process exits 0, without a traceback."""
    s = ServerProcess(jax_cache, tmp_path / "stderr.log", "--shutdown-timeout", "600")
    try:
        s.wait_ready()

        async def run():
            async with httpx.AsyncClient(base_url=s.url, timeout=60) as http:
                r, cm = await _open(http, {**LONG, "max_tokens": 250, "prompt": "GNU"})
                lines = r.aiter_lines()
                assert (await anext(lines)).startswith("data:")             # generating now
                t0 = time.monotonic()
                s.proc.send_signal(signal.SIGTERM)
                while (await http.get("/health")).status_code != 503:
                    await asyncio.sleep(0.02)
                s.proc.send_signal(signal.SIGINT)
                try:
                    return sse_events([line async for line in lines]), t0
                finally:
                    await cm.__aexit__(None, None, None)

        events, t0 = asyncio.run(run())
        assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "abort"
        assert s.proc.wait(timeout=60) == 0, s.stderr()[-2000:]
        assert time.monotonic() - t0 < 30
        assert "Traceback" not in s.stderr()
    finally:
        s.stop()
