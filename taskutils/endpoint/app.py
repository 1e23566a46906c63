"""The HTTP face of the MemAgent service (FastAPI): ``GET /v1/models``, ``POST /v1/chat/completions`` (plain and
streamed), ``GET /health``. A request's client going away cancels its document; a stream opens once the first
turn is in, so that an error before then is an HTTP status (docs/serving.md)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from taskutils.endpoint.admission import Document
from taskutils.endpoint.connections import CLOSED_KEY
from taskutils.endpoint.document_run import Outcome
from taskutils.endpoint.protocol import LONG_TEXT_FIELDS, ApiError, ChatRequest, bad_request, parse_request
from taskutils.endpoint.service import MemAgentService
from taskutils.endpoint.settings import ServeSettings
from taskutils.endpoint.spool import Spools
from taskutils.endpoint.spooled_body import TOO_DEEP, check_depth, parse_spooled

log = logging.getLogger("taskutils.endpoint")

ROUTES = ("GET /health", "GET /v1/models", "GET /v1/models/{model}", "POST /v1/chat/completions")
CLIENT_CLOSED = 499  # the status logged for a request whose client went away (nginx's convention)


async def _client_gone(request: Request) -> None:
    """Returns when the client closes its connection (the body has been read: the next message is the
    disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _loads(buffer: bytearray) -> Any:
    text = buffer.decode(json.detect_encoding(buffer), "surrogatepass")  # as json.loads decodes bytes
    del buffer[:]
    try:
        value = json.loads(text)
    except RecursionError:  # arrays or objects nested past Python's recursion limit: the client's 400, not a 500
        raise ValueError(TOO_DEEP) from None
    return check_depth(value)  # the rule of a long body's parse, whatever the size


def _too_large(settings: ServeSettings, size: int | None = None, received: int | None = None) -> ApiError:
    """The 413 of a body over the limit: by its Content-Length ``size``, or (a body sent without one) once
    ``received`` bytes of it have arrived."""
    limit = f"this server's limit of {settings.max_request_bytes:,} bytes (--max-request-bytes)"
    if size is not None:
        message = f"the request body is {size:,} bytes, over {limit}"
    else:
        message = f"the request body is over {limit}: it was refused when {received:,} bytes of it had arrived"
    return ApiError(413, message, code="request_too_large")


async def _receive(request: Request, settings: ServeSettings) -> tuple[bytearray, Spools | None]:
    """The request body as it arrives: in memory up to ``settings.spool_bytes``, past that in a temporary file
    (``spools.body``; the buffer is then empty) that is parsed only once the request has a slot: a queued request
    holds its bytes on disk and nothing else (docs/serving.md, "What a request costs"). A body over
    ``settings.max_request_bytes`` is refused (413) by its Content-Length before it is read, or once that much has
    arrived. A client that leaves half-way is one INFO line (ClientDisconnect goes on to the caller). The files
    are closed here if reading fails."""
    limit = settings.max_request_bytes
    length = request.headers.get("content-length", "")
    if limit is not None and length.isdigit() and int(length) > limit:
        raise _too_large(settings, int(length))
    buffer = bytearray()
    spools: Spools | None = None
    received = 0
    try:
        async for part in request.stream():
            received += len(part)
            if limit is not None and received > limit:
                raise _too_large(settings, received=received)
            if spools is not None:
                spools.body.write(part)
                continue
            buffer += part
            if len(buffer) > settings.spool_bytes:
                spools = Spools(settings.spool_dir)
                spools.new_body().write(buffer)
                buffer = bytearray()
    except ClientDisconnect:
        said = f" of {int(length):,}" if length.isdigit() else ""
        why = request.scope.get(CLOSED_KEY)  # the server closed it (taskutils/endpoint/connections.py)
        who = f"a client was disconnected: {why}" if why else "a client left during its upload"
        log.info("%s, after %s%s bytes of its request", who, f"{received:,}", said)
        if spools is not None:
            spools.close()
        raise
    except BaseException:
        if spools is not None:
            spools.close()
        raise
    return buffer, spools


def _spooled_parser(service: MemAgentService) -> Callable[[Spools, threading.Event], ChatRequest]:
    """How a long request's body on disk becomes a request, once admitted (in a worker thread): its long strings,
    and its short ones past a bound, stay on disk (:func:`taskutils.endpoint.spooled_body.parse_spooled`)."""
    settings = service.settings

    def parse(spools: Spools, stop: threading.Event) -> ChatRequest:
        spools.body.seek(0)
        text = spools.new_text()
        try:
            body = parse_spooled(spools.body, text, settings.spool_string_chars, LONG_TEXT_FIELDS, stop)
        except (ValueError, UnicodeDecodeError) as err:
            raise bad_request(f"the request body is not valid JSON: {err}") from None
        spools.close_body()
        return parse_request(body, settings.model, service.max_model_len)

    return parse


def _chunk(doc: Document, model: str, **fields: Any) -> str:
    payload = {"id": doc.id, "object": "chat.completion.chunk", "created": doc.created, "model": model, **fields}
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _usage(outcome: Outcome) -> dict[str, int]:
    total = outcome.prompt_tokens + outcome.completion_tokens
    return {
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": total,
    }


class _EventStream(StreamingResponse):
    """A stream that, however it ends (finished, client gone), cancels what its document still runs."""

    def __init__(self, content: AsyncIterator[bytes], doc: Document) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.doc = doc

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.doc.task is not None and not self.doc.task.done():
                self.doc.cancel("client disconnected")
                await asyncio.gather(self.doc.task, return_exceptions=True)


def _failure(doc: Document) -> ApiError | None:
    """The error of a finished document task (None when it answered)."""
    task = doc.task
    if task.cancelled():
        if doc.cancel_reason == "shutdown":
            return ApiError(
                503,
                f"the server is shutting down; the document was cancelled {doc.progress()}",
                "server_error",
                "shutting_down",
            )
        return ApiError(503, f"the document was cancelled {doc.progress()}", "server_error", "cancelled")
    error = task.exception()
    if error is None:
        return None
    return error if isinstance(error, ApiError) else ApiError(500, f"{type(error).__name__}: {error}", "server_error")


UNAUTHORIZED = ApiError(401, "missing or wrong API key", "invalid_request_error", "invalid_api_key")


async def _http_error(request: Request, err: StarletteHTTPException) -> Response:
    """Starlette's own answers (404 unknown route, 405 wrong method) in OpenAI's error shape, as every other error
    here (docs/serving.md, "Errors"); its headers (Allow on a 405) kept."""
    if err.status_code == 404:
        message = f"no route {request.url.path}; this server answers {', '.join(ROUTES)}"
    elif err.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path} (allowed: {err.headers.get('Allow', '')})"
    else:
        message = f"{request.method} {request.url.path}: {err.detail}"
    error = ApiError(err.status_code, message, code="not_found" if err.status_code == 404 else None)
    response = error.response()
    response.headers.update(err.headers or {})
    return response


async def _internal_error(request: Request, err: Exception) -> JSONResponse:
    log.error("internal error on %s %s", request.method, request.url.path, exc_info=err)
    return ApiError(500, f"internal error: {type(err).__name__}: {err}", "server_error").response()


class _ChatRoute:
    """``POST /v1/chat/completions`` of one service: the request received (spooled when long), started as a
    document, and answered whole or as a stream; a client that leaves stops its document."""

    def __init__(self, service: MemAgentService) -> None:
        self.service = service
        self.settings = service.settings
        self.parse_spooled_request = _spooled_parser(service)

    def authorized(self, request: Request) -> bool:
        if self.settings.server_key is None:
            return True
        given = request.headers.get("authorization", "")
        given = given[7:] if given.lower().startswith("bearer ") else request.headers.get("api-key", "")
        return hmac.compare_digest(given.encode(), self.settings.server_key.encode())

    async def handle(self, request: Request) -> Response:
        if not self.authorized(request):
            return UNAUTHORIZED.response()
        try:
            buffer, spools = await _receive(request, self.settings)
        except ClientDisconnect:  # logged as one line where it was read
            return Response(status_code=CLIENT_CLOSED)
        except ApiError as err:  # over the size limit
            return err.response()
        if spools is not None:
            doc = self.service.start_spooled(spools, self.parse_spooled_request)
        else:
            try:
                body = _loads(buffer)
            except (ValueError, UnicodeDecodeError) as err:
                return bad_request(f"the request body is not valid JSON: {err}").response()
            try:
                parsed = parse_request(body, self.settings.model, self.service.max_model_len)
                del body  # the parsed structure: the request keeps the texts it needs, the rest goes now
                doc = await self.service.start(parsed)
            except ApiError as err:
                return err.response()
            del parsed
        gone = asyncio.ensure_future(_client_gone(request))
        try:
            return await self._answer(doc, gone)
        finally:
            gone.cancel()

    async def _abandon(self, doc: Document) -> Response:
        """The client went away: its document stops (its turns, or its parsing or tokenizing in a thread)."""
        doc.cancel("client disconnected")
        await asyncio.gather(doc.task, return_exceptions=True)
        return Response(status_code=CLIENT_CLOSED)

    async def _answer(self, doc: Document, gone: asyncio.Future) -> Response:
        """The answer of a started document; a long one is parsed after it waited for its slot, so whether it
        streams is known once it is ready."""
        ready = asyncio.ensure_future(doc.ready.wait())
        await asyncio.wait({ready, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            ready.cancel()
            return await self._abandon(doc)
        if doc.request is None:  # its task ended before its request was parsed: refused
            await asyncio.gather(doc.task, return_exceptions=True)
            return _failure(doc).response()
        if doc.request.stream:
            return await self._stream(doc, gone)
        await asyncio.wait({doc.task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not doc.task.done():  # the client went away: stop its turns
            return await self._abandon(doc)
        error = _failure(doc)
        if error is not None:
            return error.response()
        return JSONResponse(self._completion(doc, doc.task.result()))

    def _completion(self, doc: Document, outcome: Outcome) -> dict[str, Any]:
        return {
            "id": doc.id,
            "object": "chat.completion",
            "created": doc.created,
            "model": self.settings.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": outcome.answer},
                    "finish_reason": outcome.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": _usage(outcome),
            "memagent": outcome.memagent,
        }

    async def _stream(self, doc: Document, gone: asyncio.Future) -> Response:
        """The stream opens once the first turn is in (or the document is done): an error before then is an
        HTTP status, after it an error event in the stream."""
        first = asyncio.ensure_future(doc.next_event())
        await asyncio.wait({first, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not first.done():
            first.cancel()
            return await self._abandon(doc)
        event = first.result()
        if event[0] == "end":
            error = _failure(doc)
            if error is not None:
                return error.response()
        return _EventStream(self._events(doc, event), doc)

    async def _events(self, doc: Document, event: tuple | None) -> AsyncIterator[bytes]:
        """The stream's events, each encoded here (a text that is not Unicode fails in this try, not in the server
        after it): a fault while writing them ends the stream with an error event and [DONE], counted failed."""
        try:
            async for text in self._event_texts(doc, event):
                yield text.encode()
        except Exception as err:  # a fault of this server, not of the document: the client is told, /health counts it
            log.error("%s: the stream failed", doc.id, exc_info=err)
            self.service.stream_failed(doc)
            error = ApiError(500, f"internal error while streaming: {type(err).__name__}: {err}", "server_error")
            yield f"data: {json.dumps(error.body())}\n\n".encode()  # ASCII JSON: whatever the message holds
            yield b"data: [DONE]\n\n"

    async def _event_texts(self, doc: Document, event: tuple | None) -> AsyncIterator[str]:
        model = self.settings.model
        # Progress as data chunks when the request asks (memagent.progress; the memory agent's return_memories),
        # else as SSE comments, which OpenAI clients skip (docs/serving.md, "Streaming").
        as_data = doc.request.ext.progress or doc.request.ext.return_memories
        yield _chunk(doc, model, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}])
        while True:
            if event is None:
                try:
                    event = await asyncio.wait_for(doc.next_event(), self.settings.keepalive)
                except TimeoutError:
                    yield ": keepalive\n\n"  # an SSE comment: clients skip it, proxies see the stream alive
                    continue
            if event[0] != "progress":
                for text in self._final_texts(doc):
                    yield text
                return
            progress, comment = event[1], event[2]
            if progress is not None and as_data:
                yield _chunk(doc, model, choices=[], memagent=progress)
            elif comment is not None:
                yield f": {comment}\n\n"
            event = None

    def _final_texts(self, doc: Document) -> list[str]:
        """The stream's end: the answer and its finish reason (and usage when asked), or the error; then [DONE]."""
        model = self.settings.model
        error = _failure(doc)
        if error is not None:
            return [f"data: {json.dumps(error.body(), ensure_ascii=False)}\n\n", "data: [DONE]\n\n"]
        outcome: Outcome = doc.task.result()
        texts = [
            _chunk(doc, model, choices=[{"index": 0, "delta": {"content": outcome.answer}}]),
            _chunk(
                doc,
                model,
                choices=[{"index": 0, "delta": {}, "finish_reason": outcome.finish_reason}],
                memagent=outcome.memagent,
            ),
        ]
        if doc.request.include_usage:
            texts.append(_chunk(doc, model, choices=[], usage=_usage(outcome)))
        return [*texts, "data: [DONE]\n\n"]


def build_app(service: MemAgentService) -> FastAPI:
    """The FastAPI app of one service: ``GET /v1/models``, ``POST /v1/chat/completions``, ``GET /health``."""
    settings = service.settings
    chat = _ChatRoute(service)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.loop = asyncio.get_running_loop()
        health_status, health = await service.health()
        if health_status != 200:
            log.warning("the upstream does not answer yet: %s", health["upstream"].get("error"))
        yield
        await service.client.aclose()
        service.stopped = True

    app = FastAPI(title="MemAgent", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)

    @app.get("/health")
    async def health() -> JSONResponse:
        status, body = await service.health()
        return JSONResponse(body, status_code=status)

    entry = {"id": settings.model, "object": "model", "created": 0, "owned_by": "memagent"}

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        if not chat.authorized(request):
            return UNAUTHORIZED.response()
        return JSONResponse({"object": "list", "data": [entry]})

    @app.get("/v1/models/{model:path}")
    async def model(model: str, request: Request) -> JSONResponse:
        if not chat.authorized(request):
            return UNAUTHORIZED.response()
        if model != settings.model:
            message = f"model {model!r} is not served here; this server serves {settings.model!r}"
            return ApiError(404, message, code="model_not_found", param="model").response()
        return JSONResponse(entry)

    # A plain Starlette route: the handler takes the request as it is, so FastAPI's parameter resolution (its
    # dependency machinery) has nothing to do; skipping it saves ~0.1 ms of CPU a request (docs/third_party_eval.md).
    app.router.add_route("/v1/chat/completions", chat.handle, methods=["POST"])
    return app
