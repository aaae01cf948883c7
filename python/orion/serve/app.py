"""The ASGI application: OpenAI's /v1/completions, /v1/chat/completions (streamed as server-sent
events ending in ``[DONE]``), /v1/models, /health, /tokenize, /detokenize and /metrics (Prometheus), over a
:class:`~orion.serve.scheduler.Scheduler`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass

import anyio
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from orion.serve.engine import Engine
from orion.serve.responses import Reply
from orion.serve.scheduler import Delta, Failed, Finished, Job, QueueFull, Scheduler
from orion.serve.schema import APIError, parse_json, parse_request
from orion.serve.tokenize import detokenize, tokenize
from orion.serve.tools import ToolCall, ToolCallParser


@dataclass(frozen=True)
class Limits:
    """What the server tolerates from a client."""

    max_body_bytes: int = 1 << 20  # a larger request body is a 413
    body_timeout: float = 10.0  # seconds for the whole body to arrive, else a 408
    send_timeout: float = 30.0  # seconds a streaming client may take to accept one event, else it is dropped
    disconnect_poll: float = 0.25  # how often a non-streaming request checks that its client is still there


class _Outbox:
    """Events from the worker thread to the request handlers' queues on one event loop: one call into the loop
    (a write to its wake-up socket) for the events that arrive before it runs, not one per event (a batched
    step's round emits one per stream)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._events: list[tuple[asyncio.Queue, Delta | Finished | Failed]] = []

    def put(self, queue: asyncio.Queue, event: Delta | Finished | Failed) -> None:
        """Deliver ``event`` to ``queue`` (called by the worker thread)."""
        with self._lock:
            self._events.append((queue, event))
            if len(self._events) > 1:
                return  # a delivery is scheduled and has not run yet: it takes this one too
        with contextlib.suppress(RuntimeError):  # the event loop has closed: the server is stopping
            self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            events, self._events = self._events, []
        for queue, event in events:
            queue.put_nowait(event)


def create_app(engine: Engine, *, max_waiting: int = 64, retry_after: int = 1, limits: Limits = Limits(),
               burst_wait: float = 0.0) -> Starlette:
    """The server for ``engine``; its worker thread starts and stops with the application's lifespan (``burst_wait``:
    the scheduler's)."""
    scheduler = Scheduler(engine, max_waiting=max_waiting, retry_after=retry_after, burst_wait=burst_wait)
    created = int(time.time())
    model_card = {"id": engine.model_id, "object": "model", "created": created, "owned_by": "orion"}
    outboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Outbox] = weakref.WeakKeyDictionary()

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [model_card]})

    async def model(request: Request) -> Response:
        if request.path_params["name"] != engine.model_id:
            raise APIError(404, f"the model {request.path_params['name']!r} does not exist: this server serves "
                           f"{engine.model_id!r}", param="model", code="model_not_found")
        return JSONResponse(model_card)

    async def health(request: Request) -> Response:
        waiting, active = scheduler.load()
        ok = scheduler.alive
        return JSONResponse({"status": "ok" if ok else "worker stopped", "model": engine.model_id,
                             "waiting": waiting, "active": active, **asdict(scheduler.stats)},
                            status_code=200 if ok else 503)

    async def metrics(request: Request) -> Response:
        waiting, active = scheduler.load()
        stats = scheduler.stats
        counts = {"completed": stats.completed, "cancelled": stats.cancelled, "failed": stats.failed,
                  "rejected": stats.rejected}
        return PlainTextResponse(scheduler.metrics.render(counts, waiting, active, stats.tokens),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    async def tokenize_route(request: Request) -> Response:
        return JSONResponse(tokenize(parse_json(await read_body(request, limits)), engine))

    async def detokenize_route(request: Request) -> Response:
        return JSONResponse(detokenize(parse_json(await read_body(request, limits)), engine))

    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    async def generate(request: Request, chat: bool) -> Response:
        body = parse_json(await read_body(request, limits))
        wanted = parse_request(body, engine, chat)
        loop = asyncio.get_running_loop()
        outbox = outboxes.get(loop) or outboxes.setdefault(loop, _Outbox(loop))
        events: asyncio.Queue = asyncio.Queue()

        def emit(event: Delta | Finished | Failed) -> None:  # called by the worker thread
            outbox.put(events, event)

        job = Job(wanted.prompt_ids, wanted.params, wanted.stops, emit, wanted.n)
        try:
            scheduler.submit(job)
        except QueueFull as full:
            raise APIError(503, f"{full}; retry after {full.retry_after} s", code="server_busy", kind="server_error",
                           headers={"Retry-After": str(full.retry_after)}) from full
        reply = Reply(chat, engine.model_id, engine.decode, wanted.params.logprobs is not None)
        # tool calls in each choice's reply
        calls = [None if wanted.tool_format is None else ToolCallParser(wanted.tool_format) for _ in range(wanted.n)]
        if wanted.stream:
            return EventSourceResponse(stream(job, events, reply, wanted.include_usage, calls),
                                       send_timeout=limits.send_timeout)
        return await collect(request, job, events, reply, calls)

    async def collect(request: Request, job: Job, events: asyncio.Queue, reply: Reply,
                      calls: list[ToolCallParser | None]) -> Response:
        pieces: list[list[str]] = [[] for _ in calls]
        logprobs: list[list] = [[] for _ in calls]
        done: dict[int, Finished] = {}
        try:
            while len(done) < len(calls):
                try:
                    event = await asyncio.wait_for(events.get(), limits.disconnect_poll)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return Response(status_code=499)  # nobody reads it; the finally cancels the job
                    continue
                if isinstance(event, Delta):
                    pieces[event.index].append(event.text)
                    logprobs[event.index] += event.logprobs
                elif isinstance(event, Finished):
                    done[event.index] = event
                    logprobs[event.index] += event.logprobs
                else:
                    raise generation_failed(event)
            texts, made = [], []
            for parser, chunks in zip(calls, pieces):
                items = ["".join(chunks)] if parser is None else [*parser.feed("".join(chunks)), *parser.finish()]
                texts.append("".join(item for item in items if isinstance(item, str)))
                made.append([i for i in items if isinstance(i, ToolCall)] if parser is not None else None)
            return JSONResponse(reply.whole(texts, [done[i] for i in range(len(calls))], made, logprobs))
        finally:
            job.cancel()

    async def stream(job: Job, events: asyncio.Queue, reply: Reply, include_usage: bool,
                     calls: list[ToolCallParser | None]) -> AsyncIterator[dict]:
        made = [0 for _ in calls]  # tool calls sent so far, per choice
        done: list[Finished] = []

        def chunks(index: int, items: list[str | ToolCall], logprobs: list) -> list[dict]:
            out = []
            for item in items:
                if isinstance(item, str):
                    out.append({"data": json.dumps(reply.delta(item, index, logprobs))})
                    logprobs = []
                else:
                    out.append({"data": json.dumps(reply.tool_call_delta(made[index], item, index))})
                    made[index] += 1
            return out

        try:
            for chunk in reply.first_chunks(len(calls)):
                yield {"data": json.dumps(chunk)}
            while True:
                event = await events.get()
                if isinstance(event, Delta):
                    parser = calls[event.index]
                    items = [event.text] if parser is None else calls[event.index].feed(event.text)
                    for item in chunks(event.index, items, event.logprobs):
                        yield item
                elif isinstance(event, Finished):
                    parser = calls[event.index]
                    for item in chunks(event.index, [] if parser is None else parser.finish(), []):
                        yield item
                    yield {"data": json.dumps(reply.last_chunk(event, made[event.index] > 0))}
                    done.append(event)
                    if len(done) == len(calls):
                        if include_usage:
                            yield {"data": json.dumps(reply.usage_chunk(done))}
                        yield {"data": "[DONE]"}
                        return
                else:
                    yield {"data": json.dumps(generation_failed(event).body())}
                    return
        finally:  # also when the client went away: the worker stops this job before its next token
            job.cancel()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        scheduler.start()
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(scheduler.stop)

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{name:path}", model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/tokenize", tokenize_route, methods=["POST"]),
        Route("/detokenize", detokenize_route, methods=["POST"]),
    ]
    handlers = {APIError: api_error, HTTPException: http_error, Exception: internal_error}
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    app.state.scheduler = scheduler
    return app


async def read_body(request: Request, limits: Limits) -> bytes:
    """The whole body, refused with a 413 past ``max_body_bytes`` and a 408 past ``body_timeout``."""
    limit = limits.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise APIError(413, f"the request body ({declared} bytes) is over the limit of {limit} bytes",
                       code="body_too_large")
    chunks, size = [], 0
    try:
        with anyio.fail_after(limits.body_timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise APIError(413, f"the request body is over the limit of {limit} bytes", code="body_too_large")
                chunks.append(chunk)
    except TimeoutError as exc:
        raise APIError(408, f"the request body did not arrive within {limits.body_timeout:g} s ({size} bytes "
                       f"received)", code="request_timeout") from exc
    except ClientDisconnect as exc:
        raise APIError(400, "the client disconnected before sending the whole body", code="client_disconnected") \
            from exc
    return b"".join(chunks)


def generation_failed(event: Failed) -> APIError:
    return APIError(500, f"generation failed: {type(event.error).__name__}: {event.error}", code="generation_failed",
                    kind="server_error")


async def api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
    error = APIError(exc.status_code, message.get(exc.status_code, str(exc.detail)), headers=exc.headers)
    return await api_error(request, error)


async def internal_error(request: Request, exc: Exception) -> Response:
    error = APIError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error", kind="server_error")
    return await api_error(request, error)
