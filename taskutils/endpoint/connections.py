"""The endpoint's connections: what a client may hold of the server before its request is read is bounded in bytes
and in seconds (docs/serving.md, "What a request costs").

uvicorn's h11 protocol does the HTTP, with uvicorn's own limits configured: the size of a request's head (its
request line and headers: ``h11_max_incomplete_event_size``) and how long a kept-alive connection may idle between
requests (``timeout_keep_alive``). :class:`LimitedH11Protocol` adds what uvicorn leaves open:

- a deadline for a request's head (from the connection's opening, or the previous response's end) and one for its
  body (from the head's end): a slow or idle client is disconnected, counted in ``GET /health``;
- a bound on the connections open at once, below the process's open-file limit: a connection past it closes the
  oldest connection that waits for a request (idle, or its head half-sent), or else itself, so that ``/health``
  and new clients always get in, whatever the idle connections;
- a bound on the connections sending a request's body at once (``max_uploads``): a request whose head is in and
  whose body is not, past it, has the oldest such connection answered 503 and closed, its body unread, so that
  connections that stall mid-body never hold every place (1,100 that each sent a head and a byte made ``/health``
  fail until ``--body-timeout``) and a new upload always gets in;
- a head over the size limit answered 431 (uvicorn answers any bad head 400), however it arrived
  (:class:`HeadBoundConnection`: h11 bounds only a head still incomplete, so one that came whole in a single read
  passed at any size a read holds), and a request with more headers than ``max_headers`` answered 431 by
  :class:`HeaderCount`, before the app sees it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
from dataclasses import dataclass
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("taskutils.endpoint")

# File descriptors a running document may hold besides its connection (its body, text and ids files on disk, its
# upstream connection), a queued one (its body file), and the server's own beyond those open at start-up.
FILES_PER_RUNNING = 4
FILES_PER_QUEUED = 1
FILES_PER_UPLOAD = 1  # its body's file on disk, once past --spool-bytes
SPARE_FILES = 32
MIN_CONNECTIONS = 8
CLOSED_KEY = "memagent.closed"  # in a request's scope: why the server closed its connection (LimitedH11Protocol)


@dataclass(frozen=True)
class ConnectionLimits:
    """What a connection may hold (the service's flags: taskutils/endpoint/cli.py)."""

    max_header_bytes: int = 65_536  # a request's head: its request line and headers
    max_headers: int = 100
    header_timeout: float = 30.0  # seconds for a request's head to arrive
    body_timeout: float = 300.0  # seconds for its body to arrive, once its head has
    idle_timeout: float = 5.0  # seconds a kept-alive connection may wait for its next request (uvicorn's default)
    max_connections: int | None = None  # None: the open-file limit less a reserve (connection_bound)
    max_uploads: int | None = None  # bodies arriving at once; None: the documents that may run and queue (upload_bound)

    def __post_init__(self) -> None:
        for name in ("max_header_bytes", "max_headers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("header_timeout", "body_timeout", "idle_timeout"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {getattr(self, name)}")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(
                f"max_connections must be >= 1 (None: from the open-file limit), got {self.max_connections}"
            )
        if self.max_uploads is not None and self.max_uploads < 1:
            raise ValueError(f"max_uploads must be >= 1 (None: max_documents + max_queue), got {self.max_uploads}")


@dataclass
class ConnectionCounters:
    """Totals since start (``GET /health``'s ``connections``)."""

    open: int = 0
    max_open: int = 0  # the bound in force
    closed_slow_head: int = 0  # its head did not arrive within header_timeout
    closed_slow_body: int = 0  # its body did not arrive within body_timeout
    closed_for_room: int = 0  # waiting for a request when a new connection needed its place
    refused: int = 0  # closed on arrival: every connection had a request in progress
    uploading: int = 0  # connections whose request's head is in and its body not, now
    max_uploading: int = 0  # the bound in force (max_uploads)
    uploads_closed_for_room: int = 0  # sending its body when a new upload needed its place: answered 503


def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (a server's connections are files); the
    limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        wanted = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return soft


def upload_bound(limits: ConnectionLimits, max_documents: int, max_queue: int) -> int:
    """The most request bodies arriving at once: ``limits.max_uploads``, else the documents that may run and queue
    (a body past those, all arrived, would find no place but a 503 anyway)."""
    return limits.max_uploads if limits.max_uploads is not None else max(max_documents + max_queue, 1)


def connection_bound(limits: ConnectionLimits, max_documents: int, max_queue: int) -> int:
    """The most connections the server keeps open: ``limits.max_connections``, else the open-file limit less the
    files open now and those its documents may open (running, queued and arriving) and a spare. ValueError when
    that leaves fewer than :data:`MIN_CONNECTIONS`."""
    if limits.max_connections is not None:
        return limits.max_connections
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        used = 64
    uploads = upload_bound(limits, max_documents, max_queue)
    reserve = used + FILES_PER_RUNNING * max_documents + FILES_PER_QUEUED * max_queue + SPARE_FILES
    reserve += FILES_PER_UPLOAD * uploads
    if soft - reserve < MIN_CONNECTIONS:
        raise ValueError(
            f"the open-file limit ({soft}) leaves room for {max(soft - reserve, 0)} connections once {reserve} files "
            f"are kept for the server and its documents; raise it (ulimit -n) or lower --max-queue"
        )
    return soft - reserve


class Connections:
    """The connections of one server, oldest first, and its counters."""

    def __init__(self, limits: ConnectionLimits, bound: int, uploads: int) -> None:
        self.limits = limits
        self.open: dict[LimitedH11Protocol, None] = {}  # insertion order: the oldest first
        self.uploads: dict[LimitedH11Protocol, None] = {}  # those sending their request's body, the oldest first
        self.counters = ConnectionCounters(max_open=bound, max_uploading=uploads)

    def arrived(self, new: LimitedH11Protocol) -> None:
        """A new connection; past the bound, the oldest one waiting for a request makes room (or the new one goes)."""
        self.open[new] = None
        if len(self.open) <= self.counters.max_open:
            self.counters.open = len(self.open)
            return
        victim = next((c for c in self.open if c is not new and c.waiting_for_request), None)
        if victim is None:
            self.counters.refused += 1
            victim = new
        else:
            self.counters.closed_for_room += 1
        victim.close_connection()

    def upload_begins(self, new: LimitedH11Protocol) -> None:
        """``new``'s request has its head in and not its body; past the bound the oldest upload makes room."""
        if len(self.uploads) >= self.counters.max_uploading:
            victim = next(iter(self.uploads))
            self.upload_ends(victim)
            self.counters.uploads_closed_for_room += 1
            victim.refuse_upload()
        self.uploads[new] = None
        self.counters.uploading = len(self.uploads)

    def upload_ends(self, gone: LimitedH11Protocol) -> None:
        self.uploads.pop(gone, None)
        self.counters.uploading = len(self.uploads)

    def left(self, gone: LimitedH11Protocol) -> None:
        self.open.pop(gone, None)
        self.counters.open = len(self.open)

    def status(self) -> dict[str, int]:
        return vars(self.counters)


class HeadBoundConnection(h11.Connection):
    """h11's server connection, with a request's head (its request line and headers) over ``head_limit`` bytes a
    protocol error however it arrived. h11's own limit (``max_incomplete_event_size``) holds only while the head is
    incomplete: one that came whole in one read (up to 256 KiB on a socket) was parsed at any size."""

    def __init__(self, head_limit: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=head_limit)
        self.head_limit = head_limit
        self.head_too_large = False

    def next_event(self) -> Any:
        before = len(self._receive_buffer)  # the bytes a head is parsed from are those it takes out of the buffer
        event = super().next_event()
        if isinstance(event, h11.Request) and before - len(self._receive_buffer) > self.head_limit:
            self.head_too_large = True
            raise h11.RemoteProtocolError("the request's head is over the size limit", error_status_hint=431)
        return event


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with deadlines for a request's head and body and the server's connection bound
    (module docstring). The subclass of one server is made by :func:`protocol_class`."""

    registry: Connections

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.conn = HeadBoundConnection(self.registry.limits.max_header_bytes)  # before any byte is read
        super().connection_made(transport)
        self._phase: str | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._watch()
        self.registry.arrived(self)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._set_timer(None)
        self.registry.upload_ends(self)
        self.registry.left(self)
        super().connection_lost(exc)

    @property
    def waiting_for_request(self) -> bool:
        """Idle between requests, or its request's head not all here yet: nothing of the app runs for it."""
        return self._phase == "head"

    def close_connection(self) -> None:
        self._set_timer(None)
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """A head over the size limit is 431, naming the limit; any other bad request uvicorn's 400."""
        buffered = len(self.conn.trailing_data[0])
        limit = self.registry.limits.max_header_bytes
        if buffered <= limit and not self.conn.head_too_large:
            return super().send_400_response(msg)
        log.info("a request's head passed %s bytes (--max-header-bytes): answered 431", f"{limit:,}")
        body = f"the request's head (its request line and headers) is over {limit:,} bytes (--max-header-bytes)"
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]
        for event in (h11.Response(status_code=431, headers=headers), h11.Data(data=body.encode()), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()

    def _watch(self) -> None:
        """The deadline of the phase the request is in: its head (h11's IDLE: nothing or part of it received), its
        body (SEND_BODY), none once it is all here (the app's, and the document's timeouts, take over)."""
        state = self.conn.their_state
        phase = "head" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
        if phase == self._phase or self.transport.is_closing():
            return
        self._phase = phase
        if phase == "body":
            self.registry.upload_begins(self)
        else:
            self.registry.upload_ends(self)
        limits = self.registry.limits
        self._set_timer(None if phase is None else limits.header_timeout if phase == "head" else limits.body_timeout)

    def refuse_upload(self) -> None:
        """503 and close, the body unread (the app waiting for it learns why: taskutils/endpoint/app.py)."""
        limit = self.registry.counters.max_uploading
        why = f"its body was still arriving when a newer request's needed its place ({limit:,} at once: --max-uploads)"
        if self.scope is not None:
            self.scope[CLOSED_KEY] = why
        body = f"server busy: {why}; retry later"
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]
        for event in (h11.Response(status_code=503, headers=headers), h11.Data(data=body.encode()), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.close_connection()

    def _set_timer(self, seconds: float | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None if seconds is None else self.loop.call_later(seconds, self._expired, self._phase)

    def _expired(self, phase: str) -> None:
        limits, counters = self.registry.limits, self.registry.counters
        if phase == "head":
            counters.closed_slow_head += 1
        else:
            counters.closed_slow_body += 1
            if self.scope is not None:  # the app reading the body learns why it ends (taskutils/endpoint/app.py)
                self.scope[CLOSED_KEY] = f"its body did not arrive within {limits.body_timeout:g} s (--body-timeout)"
        self.close_connection()


def protocol_class(connections: Connections) -> type[LimitedH11Protocol]:
    """The protocol class of one server (uvicorn builds one protocol per connection from a class)."""
    return type("ServerH11Protocol", (LimitedH11Protocol,), {"registry": connections})


@dataclass
class HeaderCount:
    """An ASGI wrapper: a request with more than ``limit`` headers is answered 431 before the app sees it."""

    app: Any
    limit: int

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or len(scope["headers"]) <= self.limit:
            return await self.app(scope, receive, send)
        message = f"the request has {len(scope['headers'])} headers, over {self.limit} (--max-headers)"
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                     "code": "too_many_headers"}}).encode()  # fmt: skip
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        await send({"type": "http.response.start", "status": 431, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def server_config(app: Any, connections: Connections, **options: Any) -> uvicorn.Config:
    """The uvicorn config of a server with these connection limits; ``options``: host, port, log level, ..."""
    limits = connections.limits
    return uvicorn.Config(
        HeaderCount(app, limits.max_headers),
        http=protocol_class(connections),
        h11_max_incomplete_event_size=limits.max_header_bytes,
        timeout_keep_alive=limits.idle_timeout,
        **options,
    )
