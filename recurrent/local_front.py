"""The front of ``python -m recurrent.local_server``: what an agent tried against it asks for is what the harness,
the endpoint and training give it.

``transformers serve`` answers one choice whatever ``n`` asks, and samples a request that sets ``temperature``
alone at its model's own ``top_p``. The front takes every request on the public port and passes it on to the
server behind it, with two changes (docs/write_your_own_agent.md, "Sampling of its own"):

- ``n`` completions are ``n`` requests made at once, answered as one completion with choices ``0..n-1`` (the
  prompt's tokens counted once), as the recording route does in training; ``n`` with ``stream`` is refused (400);
- a request's sampling follows the one rule of :mod:`recurrent.sampling`: it sets ``temperature`` or ``top_p``,
  and the other is 1.0; it sets neither, and the server's are the run's (``--temperature``, ``--top-p``, the
  paper's evaluation values by default, as the harness and the endpoint).

Everything else (``/v1/models``, ``/health``, streams) goes through as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2  # the HTTP library of the openai package (a hard dependency of it)
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from recurrent.openai_route import MAX_COMPLETIONS  # the bound of n everywhere (OpenAI's too)
from recurrent.sampling import CALL_FIELDS, SamplingError, call_sampling, check_value

CHAT_PATH = "v1/chat/completions"
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}


class FrontError(Exception):
    """A request the front refuses: a status and a message, in OpenAI's error shape."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _error(status: int, message: str) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}}, status)


def completions_of(body: dict[str, Any], run_sampling: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """How many completions a chat request asks for and the body each one is sent with (``n`` taken out, the
    sampling made whole by the rule); :class:`FrontError` for a bad ``n``."""
    n = body.get("n")
    n = 1 if n is None else n
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_COMPLETIONS:
        raise FrontError(400, f"n must be an integer in [1, {MAX_COMPLETIONS}], got {n!r}")
    if n > 1 and body.get("stream"):
        raise FrontError(400, "n > 1 with stream: this server streams one completion at a time")
    own = {name: body[name] for name in CALL_FIELDS if body.get(name) is not None}
    try:
        for name, value in own.items():
            check_value(name, value)
    except SamplingError as err:
        raise FrontError(400, str(err)) from None
    sent = {key: value for key, value in body.items() if key != "n"}
    sent.update(call_sampling({k: run_sampling.get(k) for k in CALL_FIELDS}, own))
    return n, sent


def merged(replies: list[dict[str, Any]]) -> dict[str, Any]:
    """``n`` completions of one prompt as one: the first's envelope, every reply's choice numbered in order, the
    prompt's tokens once and every completion's."""
    first = dict(replies[0])
    choices = []
    for index, reply in enumerate(replies):
        for choice in reply.get("choices") or []:
            choices.append({**choice, "index": index})
    first["choices"] = choices
    usages = [reply.get("usage") or {} for reply in replies]
    if all(usages):
        prompt = int(usages[0].get("prompt_tokens", 0))
        completion = sum(int(u.get("completion_tokens", 0)) for u in usages)
        first["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return first


def front_app(upstream: str, run_sampling: dict[str, Any]) -> FastAPI:
    """The front over the server at ``upstream`` (``http://127.0.0.1:PORT``), ``run_sampling`` the values of a
    request that sets neither ``temperature`` nor ``top_p``."""
    client = httpx2.AsyncClient(base_url=upstream, timeout=httpx2.Timeout(None, connect=10.0))

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await client.aclose()

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "OPTIONS"])
    async def forward(path: str, request: Request) -> Response:
        raw = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS | {"host"}}
        if request.method == "POST" and path.strip("/") == CHAT_PATH:
            try:
                body = json.loads(raw)
                if not isinstance(body, dict):
                    raise FrontError(400, "the request body must be a JSON object")
                n, sent = completions_of(body, run_sampling)
            except json.JSONDecodeError as err:
                return _error(400, f"the request body is not JSON ({err.msg})")
            except FrontError as err:
                return _error(err.status, str(err))
            raw = json.dumps(sent).encode()
            if n > 1:
                return await _many(client, path, headers, raw, n)
        upstream_request = client.build_request(request.method, path, content=raw, headers=headers)
        reply = await client.send(upstream_request, stream=True)
        kept = {k: v for k, v in reply.headers.items() if k.lower() not in HOP_HEADERS}

        async def body_of() -> Any:
            try:
                async for part in reply.aiter_raw():
                    yield part
            finally:
                await reply.aclose()

        return StreamingResponse(body_of(), reply.status_code, kept)

    return app


async def _many(client: httpx2.AsyncClient, path: str, headers: dict[str, str], raw: bytes, n: int) -> Response:
    """``n`` requests of ``raw`` made at once, answered as one completion (the first failure answered as it is)."""
    replies = await asyncio.gather(*(client.post(path, content=raw, headers=headers) for _ in range(n)))
    for reply in replies:
        if reply.status_code != 200:
            return Response(reply.content, reply.status_code, media_type=reply.headers.get("content-type"))
    return JSONResponse(merged([reply.json() for reply in replies]))
