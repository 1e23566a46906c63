"""What the server tests share: a scripted OpenAI-style upstream (real sockets, its own thread and event loop) that
counts, holds, fails and notices disconnects on demand; the server run in this process (uvicorn in a thread) or
as its command line; waiting on the server's counters."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from aiohttp import web
from threaded_http import serve_in_a_thread

from recurrent.client import OpenAIChatClient
from recurrent.local_server import free_port, wait_ready
from taskutils.endpoint.app import build_app
from taskutils.endpoint.connections import ConnectionLimits, Connections, connection_bound, server_config, upload_bound
from taskutils.endpoint.service import MemAgentService
from taskutils.endpoint.settings import ServeSettings

REPO = Path(__file__).resolve().parents[3]
WAIT = 60.0  # seconds any awaited event may take before a test fails (a bound, never a pause)
# One client for the tests' requests to local servers: httpx.get and httpx.post build a client, and its TLS context
# (~50 ms loading CA certificates), on every call. No kept-alive connections: each request opens its own, as before.
HTTP = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))
UPSTREAM_PROMPT_TOKENS, UPSTREAM_COMPLETION_TOKENS = 10, 3  # the scripted upstream's usage of every reply
QUESTION = "Which river runs past the stone village?"
# Seven sentences of plain words: with 16-token chunks the tiny tokenizer cuts it into several chunks.
DOCUMENT = " ".join(
    f"Sentence number {i} tells of the river, the stone and the village by the quiet meadow." for i in range(7)
)


class ScriptedUpstream:
    """An OpenAI-style upstream. Chat requests are numbered from 1; ``hold`` names those that wait until
    :meth:`release` (or until their client disconnects, which :attr:`aborted` records); ``fail`` answers every
    chat request with ``(status, body)``; ``raw`` answers the request of a number with ``(content type, bytes)``
    as they are; ``hold_models`` makes ``GET /models`` wait until :meth:`release`; every reply has the usage
    above."""

    def __init__(self) -> None:
        self.url = ""
        self.model = "scripted"
        self.reply = "the memory so far"
        self.hold: set[int] = set()
        self.fail: tuple[int, Any] | None = None
        self.raw: dict[int, tuple[str, bytes]] = {}
        self.hold_models = False
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.arrived: dict[int, threading.Event] = collections.defaultdict(threading.Event)
        self.aborted: dict[int, threading.Event] = collections.defaultdict(threading.Event)
        self.in_flight = 0
        self.max_in_flight = 0
        self._release: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def requests(self) -> int:
        return len(self.bodies)

    def release(self) -> None:
        self._loop.call_soon_threadsafe(self._release.set)

    async def _models(self, request: web.Request) -> web.Response:
        if self.hold_models:
            await self._release.wait()
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        number = len(self.bodies)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.arrived[number].set()
        try:
            if number in self.hold:
                await self._release.wait()
            if number in self.raw:
                kind, data = self.raw[number]
                return web.Response(body=data, content_type=kind)
            if self.fail is not None:
                status, payload = self.fail
                if isinstance(payload, str):
                    return web.Response(text=payload, status=status)
                return web.json_response(payload, status=status)
            return web.json_response(
                {
                    "id": f"chatcmpl-{number}",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body.get("model"),
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": self.reply}, "finish_reason": "stop"}
                    ],
                    "usage": {
                        "prompt_tokens": UPSTREAM_PROMPT_TOKENS,
                        "completion_tokens": UPSTREAM_COMPLETION_TOKENS,
                        "total_tokens": UPSTREAM_PROMPT_TOKENS + UPSTREAM_COMPLETION_TOKENS,
                    },
                }
            )
        except asyncio.CancelledError:  # aiohttp cancels the handler when its client disconnects
            self.aborted[number].set()
            raise
        finally:
            self.in_flight -= 1

    @contextlib.contextmanager
    def running(self) -> Iterator[ScriptedUpstream]:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)

        def started(loop: asyncio.AbstractEventLoop) -> None:
            self._loop, self._release = loop, asyncio.Event()

        with serve_in_a_thread(app, WAIT, on_start=started, handler_cancellation=True) as url:
            self.url = url
            try:
                yield self
            finally:
                self.release()  # held requests end, so the loop can stop


@contextlib.contextmanager
def served(
    upstream: str,
    upstream_model: str,
    tokenizer: Any,
    api_key: str | None = None,
    log_level: str = "warning",
    **settings: Any,
) -> Iterator[tuple[str, MemAgentService]]:
    """The server in this process (uvicorn in a thread) in front of ``upstream``: its base URL and its service.
    Client settings: no retry, a fast backoff; ``timeout`` per upstream attempt may be given. ``limits``: its
    connection limits (the command line's defaults if not given). uvicorn's loggers are left to propagate, so that
    ``caplog`` sees them too."""
    client = OpenAIChatClient(
        upstream,
        upstream_model,
        api_key=api_key,
        max_concurrency=settings.get("max_documents", ServeSettings.max_documents),  # one call per document: the CLI's
        max_retries=0,
        backoff=0.01,
        timeout=settings.pop("timeout", WAIT),
    )
    limits = settings.pop("limits", ConnectionLimits())
    service = MemAgentService(ServeSettings(**{"model": "memagent", **settings}), tokenizer, client)
    port = free_port()
    app = build_app(service)
    s = service.settings
    bounds = (
        connection_bound(limits, s.max_documents, s.max_queue),
        upload_bound(limits, s.max_documents, s.max_queue),
    )
    service.connections = Connections(limits, *bounds)
    options = {"host": "127.0.0.1", "port": port, "log_level": log_level, "log_config": None, "lifespan": "on"}
    config = server_config(app, service.connections, **options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}/v1"
    wait_ready(answers(f"{base}/models"), None, WAIT, 0.02, name="the MemAgent server")
    try:
        yield base, service
    finally:
        server.should_exit = True
        thread.join(WAIT)


def answers(url: str) -> Callable[[], str | None]:
    """A readiness probe: ready once ``GET url`` gets any HTTP answer (a server with a key answers 401)."""

    def probe() -> str | None:
        try:
            HTTP.get(url, timeout=2)
        except httpx.HTTPError as err:
            return f"GET {url}: {err}"
        return None

    return probe


def health(base: str) -> dict[str, Any]:
    return HTTP.get(base.removesuffix("/v1") + "/health", timeout=WAIT).json()


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Return once ``condition()`` holds (checked every 20 ms), fail after :data:`WAIT` seconds."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def wait_event(event: threading.Event, what: str) -> None:
    assert event.wait(WAIT), f"timed out waiting for {what}"


def counters(base: str) -> dict[str, int]:
    return health(base)["counters"]


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "taskutils.endpoint", *args]


def serve_env() -> dict[str, str]:
    """The environment of a server process: this checkout's packages first, whatever its working directory."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}


@contextlib.contextmanager
def serve_process(*args: str, log_path: Path, cwd: Path = REPO) -> Iterator[tuple[str, subprocess.Popen]]:
    """``python -m taskutils.endpoint ARGS --port P`` (run in ``cwd``) until the block ends (SIGTERM, then SIGKILL if
    it hangs)."""
    port = free_port()
    with log_path.open("w") as log:
        process = subprocess.Popen(
            serve_command(*args, "--port", str(port)), stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=serve_env()
        )
    base = f"http://127.0.0.1:{port}/v1"
    try:
        wait_ready(answers(f"{base}/models"), process, 180, 0.1, log_path, "python -m taskutils.endpoint")
        yield base, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(WAIT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def stream_lines(base: str, request: dict[str, Any]) -> list[str]:
    """Every line of a streamed chat completion, read to its end."""
    with httpx.Client(timeout=WAIT) as http, http.stream("POST", f"{base}/chat/completions", json=request) as r:
        assert r.status_code == 200, r.read()
        return list(r.iter_lines())


def sse_events(lines: Iterator[str]) -> Iterator[dict | str]:
    """The data of each server-sent event (``"[DONE]"`` as a string), comments skipped."""
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            yield data if data == "[DONE]" else json.loads(data)
