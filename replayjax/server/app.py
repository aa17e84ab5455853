"""The ASGI app (Starlette): OpenAI's /v1/completions, /v1/chat/completions and /v1/models, plus
/health and /metrics, over one `EngineWorker`.

Every answer other than 200 is in OpenAI's error shape. A request's choices (n for each prompt)
are generations of their own, run side by side; a stream interleaves their chunks, each naming
its choice's index. Admission: a bounded queue (429 with Retry-After when full; 400 for a
request of more choices than the slots and the queue hold together) and a drain for shutdown
(503 for new requests while the ones in flight finish or, at the deadline, end with
finish_reason "abort"). A client that goes away has its request cancelled; the engine frees its
slots at the next host visit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import time

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from replayjax.requests import RequestError
from replayjax.server import protocol
from replayjax.server.chat import ChatTemplate, ChatTemplateError
from replayjax.server.generation import Generation
from replayjax.server.metrics import CONTENT_TYPE, Metrics
from replayjax.server.protocol import ApiError, Reply, ServedModel, error_body
from replayjax.server.reasoning import ReasoningStream, split_reasoning
from replayjax.server.tools import ToolStream, call_tag, split_reply
from replayjax.server.worker import EngineFailed, EngineWorker

log = logging.getLogger("replayjax.server")

ABORT_GRACE_S = 10.0      # after aborting at the drain deadline: time for the streams to end
POLL_S = 0.05


@dataclasses.dataclass(eq=False)
class ServerState:
    """What the handlers share: the engine thread, the tokenizer (a `tokenizers.Tokenizer`), the
    chat template (None: the model has none, chat requests get a 400), its tool-call format
    (`tools.template_format`; None: requests with tools get a 400) and whether replies' thinking
    is split off (`reasoning`), metrics, admission."""
    worker: EngineWorker
    tokenizer: object
    chat_template: ChatTemplate | None
    served: ServedModel
    metrics: Metrics
    max_queue: int
    tool_format: str | None = None
    reasoning: bool = False
    max_body_bytes: int = 16_000_000        # a request body past this answers 413 (16 MB)
    started: int = dataclasses.field(default_factory=lambda: int(time.time()))
    draining: bool = False
    hurry: bool = False                     # a second signal: abort what is in flight now
    live: set = dataclasses.field(default_factory=set)        # Generations in flight

    def encode(self, text: str) -> list:
        """A completion prompt's token ids (special tokens added, as Hugging Face does)."""
        return self.tokenizer.encode(text).ids

    def render(self, messages: list, kwargs: dict) -> str:
        """A chat's prompt text (the chat template's)."""
        if self.chat_template is None:
            raise ApiError("This model has no chat template (tokenizer_config.json "
                           "'chat_template' or chat_template.jinja); use /v1/completions, or "
                           "start the server with --chat-template FILE.", param="messages")
        try:
            return self.chat_template.render(messages, kwargs)
        except ChatTemplateError as e:
            raise ApiError(str(e), param="messages") from None

    def spell(self, token: int) -> str:
        """A token's own text (special tokens too), for log probabilities."""
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def encode_chat(self, text: str) -> list:
        """A chat prompt's token ids: without special tokens added (the template writes
        them)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def admit(self, choices: list, reply: Reply) -> list:
        """Submits a checked request's choices (`protocol.GenerationParams`, in index order) to
        the engine, all or none, as Generations (ApiError: 503 when draining or the engine
        failed, 429 when the queue would overflow, 400 when the request could never fit or the
        engine refuses a choice)."""
        if self.worker.failed:
            raise ApiError(str(self.worker.failed), status=503, type="server_error",
                           code="engine_failed")
        if self.draining:
            raise ApiError("The server is shutting down; send the request elsewhere.",
                           status=503, type="server_error", code="shutting_down")
        # in flight past the slots: waiting (the engine's own queue also holds those that a
        # free slot takes at its next visit)
        slots, k = self.worker.load()[2], len(choices)
        if k > slots + self.max_queue:
            raise ApiError(f"The request asks for {k} choices; this server holds at most "
                           f"{slots + self.max_queue} at once ({slots} slots and a queue of "
                           f"{self.max_queue}).",
                           param="n" if any(c.choice for c in choices) else "prompt",
                           code="too_many_choices")
        waiting = max(0, len(self.live) - slots)
        if len(self.live) + k - slots > self.max_queue:
            mine = (f"; with this request's {k} choices {len(self.live) + k - slots} would "
                    f"wait" if k > 1 else "")
            raise ApiError(f"The server is busy: {waiting} requests are waiting for a slot (at "
                           f"most {self.max_queue}{mine}); retry later.", status=429,
                           type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": "1"})
        gens = []
        try:
            for i, params in enumerate(choices):
                rid = reply.id if k == 1 else f"{reply.id}-{i}"
                gens.append(Generation(rid, params, self.worker, self.tokenizer, self.metrics))
                gens[-1].start()
        except RequestError as e:
            for gen in gens[:-1]:               # started: the engine drops them
                self.worker.cancel(gen.id)
            raise ApiError(str(e)) from None
        self.live.update(gens)
        return gens

    async def drain(self, timeout: float) -> None:
        """Refuses new requests (503), gives those in flight `timeout` seconds to finish, then
        aborts the rest and waits (a bounded time) for their responses to end."""
        self.draining = True
        deadline = time.monotonic() + timeout
        while self.live and not self.hurry and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        if self.live:
            log.warning("shutdown: aborting %d requests still running", len(self.live))
            for gen in list(self.live):
                gen.abort()
        deadline = time.monotonic() + ABORT_GRACE_S
        while self.live and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)


# ---------------------------------------------------------------------- generation endpoints

async def _read_body(request: Request, limit: int) -> bytes:
    """The raw body, read no further than `limit` bytes (ApiError 413 past it, whether the
    client declared its length or streams it chunked): a client cannot make the server hold an
    unbounded body."""
    too_large = ApiError(f"The request body exceeds this server's limit of {limit} bytes "
                         f"(replayjax serve --max-request-mb).", status=413,
                         code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        parts.append(chunk)
    return b"".join(parts)


async def _json_body(request: Request, limit: int):
    """The parsed body (ApiError 413 past `limit` bytes; 400 when it is not JSON, nests past the
    parser's depth limit, or holds a string that is not valid Unicode)."""
    raw = await _read_body(request, limit)
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ApiError("The JSON body of your request nests too deeply.") from None
    except (ValueError, UnicodeDecodeError):
        raise ApiError("We could not parse the JSON body of your request. (HINT: This likely "
                       "means you aren't using your HTTP library correctly. The OpenAI API "
                       "expects a JSON payload.)") from None
    protocol.check_unicode(body)
    return body


async def _disconnect(receive) -> None:
    """Returns when the client has gone away (the request body is read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _sse(obj) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


class EventStream:
    """An ASGI response of server-sent events: `data: <json>` for each object of
    `chunks(disconnected)` (disconnected: a future done when the client goes away), then
    `data: [DONE]`."""

    def __init__(self, chunks):
        self.chunks = chunks

    async def __call__(self, scope, receive, send):
        disconnected = asyncio.ensure_future(_disconnect(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]})
            async with contextlib.aclosing(self.chunks(disconnected)) as chunks:
                async for obj in chunks:
                    await send({"type": "http.response.body", "body": _sse(obj),
                                "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n",
                        "more_body": False})
        finally:
            disconnected.cancel()


def _usage(gens: list) -> dict:
    """The request's usage: each prompt's tokens once (its first choice's), every choice's
    completion tokens."""
    firsts = [g for g in gens if g.params.choice == 0]
    return protocol.usage(sum(g.prompt_tokens for g in firsts),
                          sum(g.completion_tokens for g in gens),
                          sum(g.cached_tokens for g in firsts))


async def _merged(streams):
    """The items of several async iterators as they come, each one's in its order; the first
    exception in any ends them all (they are closed) and is raised."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(stream):
        try:
            async for item in stream:
                await queue.put((True, item))
            await queue.put((False, None))
        except Exception as e:      # noqa: BLE001 (handed over, raised below)
            await queue.put((False, e))

    tasks = [asyncio.ensure_future(pump(s)) for s in streams]
    try:
        for _ in tasks:
            while (got := await queue.get())[0]:
                yield got[1]
            if got[1] is not None:
                raise got[1]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _logprobs(gen: Generation, reply: Reply, spell, entries=None, offset: int = 0):
    """The choice's logprobs object of `entries` (None: all its tokens'), or None when it asked
    for none."""
    k = gen.params.logprobs
    if k is None:
        return None
    entries = gen.token_logprobs if entries is None else entries
    return (protocol.chat_logprobs(entries, spell, k) if reply.chat
            else protocol.completion_logprobs(entries, spell, k, offset))


async def _choice_chunks(gen: Generation, index: int, reply: Reply, spell, disconnected):
    """One choice's chunks: (chat) the assistant role, a chunk per text piece (thinking as
    reasoning_content when split off; the log probabilities of its tokens on its last chunk),
    (with tools) the tool calls once the reply is whole, the finish reason ("tool_calls" when
    it called one)."""
    p = gen.params
    if reply.chat:
        yield reply.chunk(first=True, index=index)
    think = ReasoningStream(p.thinking, call_tag(p.tools)) if p.thinking is not None else None
    tools = ToolStream(p.tools) if p.tools else None
    sent = 0                    # text sent (completions' text_offset)

    def chunks(split):          # split: (reasoning, content) of a piece
        nonlocal sent
        thought, text = split
        out = [reply.chunk(reasoning=thought, index=index)] if thought else []
        if tools is not None and text:
            text = tools.push(text)
        if text:
            out.append(reply.chunk(text, index=index))
        if lps := gen.new_logprobs():        # (none unless the request asked for them)
            out = out or [reply.chunk(index=index)]
            out[-1]["choices"][0]["logprobs"] = _logprobs(gen, reply, spell, lps, sent)
        sent += len(text)
        return out

    async with contextlib.aclosing(gen.pieces(disconnected)) as pieces:
        async for piece in pieces:
            for chunk in chunks(think.push(piece) if think else ("", piece)):
                yield chunk
    if gen.finish_reason == "cancelled":
        return
    for chunk in chunks(think.finish() if think else ("", "")):
        yield chunk
    reason = gen.finish_reason
    if tools is not None:
        rest, calls = tools.finish()
        if rest:
            yield reply.chunk(rest, index=index)
        for j, call in enumerate(calls):
            yield reply.chunk(index=index, tool_calls=[(j, call)])
        reason = "tool_calls" if calls else reason
    yield reply.chunk(finish_reason=reason, index=index)


async def _chunks(st: ServerState, gens: list, reply: Reply, disconnected):
    """A streaming request's chunks: its choices' chunks as they come, then (include_usage)
    the usage."""
    streams = [_choice_chunks(g, i, reply, st.spell, disconnected)
               for i, g in enumerate(gens)]
    try:
        async with contextlib.aclosing(_merged(streams)) as chunks:
            async for chunk in chunks:
                yield chunk
        if gens[0].params.include_usage and not disconnected.done():
            yield reply.usage_chunk(_usage(gens))
    except EngineFailed as e:           # or RequestFailed: this request only
        yield error_body(str(e), "server_error", code=e.code)
    finally:
        st.live.difference_update(gens)


async def _text(gen: Generation, disconnected) -> str:
    async with contextlib.aclosing(gen.pieces(disconnected)) as pieces:
        return "".join([p async for p in pieces])


async def _generate(request: Request, chat: bool):
    st: ServerState = request.app.state.server
    try:
        body = await _json_body(request, st.max_body_bytes)
        # parsing tokenizes (and renders a chat template): in a worker thread, so a long prompt
        # does not stall the event loop and with it every running stream
        parse = (functools.partial(protocol.parse_chat, render=st.render,
                                   encode=st.encode_chat, tool_format=st.tool_format,
                                   reasoning=st.reasoning) if chat
                 else functools.partial(protocol.parse_completion, encode=st.encode))
        choices = await asyncio.to_thread(parse, body, st.served)
        reply = Reply.new(chat, st.served.name)
        gens = st.admit(choices, reply)
    except ApiError as e:
        st.metrics.rejected.labels(e.code or e.type).inc()
        raise
    if choices[0].stream:
        return EventStream(lambda disconnected: _chunks(st, gens, reply, disconnected))
    disconnected = asyncio.ensure_future(_disconnect(request.receive))
    tasks = [asyncio.ensure_future(_text(g, disconnected)) for g in gens]
    try:
        texts = await asyncio.gather(*tasks)
    except EngineFailed as e:           # or RequestFailed: this request only
        raise ApiError(str(e), status=e.status, type="server_error", code=e.code) from None
    finally:                            # (a failed choice ends the others)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        disconnected.cancel()
        st.live.difference_update(gens)
    return JSONResponse(reply.response([_answer(t, g, reply, st.spell)
                                        for t, g in zip(texts, gens)], _usage(gens)))


def _answer(text: str, gen: Generation, reply: Reply, spell) -> tuple:
    """A whole choice as `Reply.response` takes it: its (chat: content) text, the finish
    reason ("tool_calls" when it called one), its tool calls, its thinking (split off) and its
    tokens' log probabilities."""
    p = gen.params
    reasoning, content = (split_reasoning(text, p.thinking, call_tag(p.tools))
                          if p.thinking is not None else (None, text))
    content, calls = split_reply(content, p.tools) if p.tools else (content, [])
    return (content, "tool_calls" if calls else gen.finish_reason, calls, reasoning,
            _logprobs(gen, reply, spell))


async def completions(request: Request):
    return await _generate(request, chat=False)


async def chat_completions(request: Request):
    return await _generate(request, chat=True)


# ---------------------------------------------------------------------- the rest

def _model_card(st: ServerState) -> dict:
    return {"id": st.served.name, "object": "model", "created": st.started,
            "owned_by": "replayjax", "max_model_len": st.served.max_len}


async def models(request: Request):
    return JSONResponse({"object": "list", "data": [_model_card(request.app.state.server)]})


async def model(request: Request):
    """GET /v1/models/{id} (OpenAI's models.retrieve): the served model's card, else a 404."""
    st: ServerState = request.app.state.server
    name = request.path_params["name"]
    if name != st.served.name:
        raise ApiError(f"The model '{name}' does not exist (this server serves "
                       f"'{st.served.name}').", status=404, param="model",
                       code="model_not_found")
    return JSONResponse(_model_card(st))


async def health(request: Request):
    """200 {"status": "ok", ...} while serving; 503 when draining or the engine failed."""
    st: ServerState = request.app.state.server
    queued, running, slots = st.worker.load()
    status = "failed" if st.worker.failed else "draining" if st.draining else "ok"
    return JSONResponse({"status": status, "queued": queued, "running": running,
                         "slots": slots, "in_flight": len(st.live)},
                        status_code=200 if status == "ok" else 503)


async def metrics(request: Request):
    return Response(request.app.state.server.metrics.text(), media_type=CONTENT_TYPE)


async def _api_error(request, exc: ApiError):
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _http_error(request, exc: HTTPException):
    message = {404: f"Unknown endpoint: {request.method} {request.url.path}",
               405: f"Method {request.method} is not allowed on {request.url.path}"}.get(
                   exc.status_code, exc.detail)
    return JSONResponse(error_body(message, code=str(exc.status_code)),
                        status_code=exc.status_code, headers=exc.headers)


async def _server_error(request, exc: Exception):
    """A bug: 500 in OpenAI's shape (Starlette re-raises it after, so the server logs the
    traceback)."""
    return JSONResponse(error_body(f"Internal server error ({type(exc).__name__}); the server "
                                   f"log has the details.", "server_error",
                                   code="internal_error"), status_code=500)


def create_app(state: ServerState) -> Starlette:
    app = Starlette(routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{name:path}", model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ], exception_handlers={ApiError: _api_error, HTTPException: _http_error,
                           Exception: _server_error})
    app.state.server = state
    return app
