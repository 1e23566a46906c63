"""Admission and queueing of the endpoint's documents: a limit on documents in flight (slots) with a bounded waiting
queue, a document cancelled when its client leaves or the server shuts down, the drain on SIGTERM, and the counters
``GET /health`` reports. What a document does once it has its slot is :mod:`taskutils.endpoint.document_run`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from recurrent.impls.memory_episode import MemoryEpisode
from recurrent.interface import Episode
from taskutils.endpoint.protocol import ApiError, ChatRequest
from taskutils.endpoint.questions import Found
from taskutils.endpoint.settings import ServeSettings
from taskutils.endpoint.spool import Spools

log = logging.getLogger("taskutils.endpoint")

# Progress events a stream may hold that its writer has not taken: once its client stops reading, the connection's
# buffers fill, the writer stops taking events, and the document's next upstream call waits (Document.paced).
STREAM_AHEAD = 2


@dataclass(eq=False)  # identity: documents live in a set
class Document:
    """One request in the service: its events feed a stream, its task runs the turns. A long request waits for
    its slot as its body on disk: ``request`` is None until its task has parsed it (``ready`` is set then, or
    when the task ends first)."""

    request: ChatRequest | None
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    task: asyncio.Task | None = None
    found: Found | None = None
    passthrough: bool = False  # the request goes upstream as it is
    session: MemoryEpisode | None = None  # the memory agent's reading
    episode: Episode | None = None  # any other agent's run
    state: str = "new"  # new, queued, running, done
    # Why the service cancelled it: "client disconnected", "shutdown", "stream failed" (counted failed).
    cancel_reason: str | None = None
    counted: str | None = None  # the counter it went to once it ended: completed, failed, cancelled
    spools: Spools | None = None  # a long request's files, closed when its task ends
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    # Set when the task is cancelled: the work it handed to a thread (parsing, tokenizing) stops at its next check.
    stop: threading.Event = field(default_factory=threading.Event)
    parse: Callable[[Spools, threading.Event], ChatRequest] | None = None  # a long request's, until it is parsed
    taken: asyncio.Event = field(default_factory=asyncio.Event)  # set each time the stream's writer takes an event
    waiting_for_reader: bool = False  # its next upstream call waits for its stream's client (GET /health)

    def progress(self) -> str:
        if self.episode is not None:
            return f"after {len(self.episode.history)} calls"
        if self.session is None:
            return f"while {self.state}"
        return f"after {len(self.session.history)} of {self.session.num_chunks + 1} turns"

    async def next_event(self) -> tuple:
        """The next event for the stream's writer (the app), which lets a call waiting for it go on."""
        event = await self.events.get()
        self.taken.set()
        return event

    async def wait_for_reader(self) -> None:
        """Return once the stream's writer has taken all but :data:`STREAM_AHEAD` of the events put: a client
        that does not read holds its document's next upstream call (without it, 461 calls ran while a client read
        141 KB, their events piling up in the server's memory)."""
        while self.events.qsize() >= STREAM_AHEAD:
            self.waiting_for_reader = True
            self.taken.clear()
            try:
                await self.taken.wait()
            finally:
                self.waiting_for_reader = False

    def paced(self, client: Any) -> Any:
        """``client`` for this document's run: a streamed one's calls each wait for its reader first."""
        return _PacedClient(client, self) if self.request is not None and self.request.stream else client

    def cancel(self, reason: str) -> None:
        if self.task is not None and not self.task.done():
            self.cancel_reason = self.cancel_reason or reason
            self.task.cancel(reason)


class _PacedClient:
    """A streamed document's client: each call first waits until the stream's client has taken the events before it
    (:meth:`Document.wait_for_reader`); anything else is the run's client's."""

    def __init__(self, client: Any, doc: Document) -> None:
        self._client, self._doc = client, doc

    async def chat(self, messages: list[dict[str, Any]], max_tokens: int, **options: Any) -> Any:
        await self._doc.wait_for_reader()
        return await self._client.chat(messages, max_tokens, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@dataclass
class Counters:
    """Totals since start (``GET /health``): tests and operators read them."""

    documents: int = 0  # admitted to a slot
    completed: int = 0
    failed: int = 0  # answered with an error after admission
    cancelled: int = 0  # stopped by a client disconnect or a shutdown
    rejected: int = 0  # refused before a slot (queue full, queue timeout, shutting down) or a long request's 4xx
    turns: int = 0  # upstream replies
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Admission:
    """The documents in flight: at most ``max_documents`` running, at most ``max_queue`` waiting for a slot (each
    for ``queue_timeout`` seconds at most), none admitted once the drain has begun; every document counted once
    when it ends."""

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.counters = Counters()
        self.documents: set[Document] = set()
        self.draining = False
        self.queued = 0
        self.running = 0
        self._slots: asyncio.Semaphore | None = None  # made on the server's event loop, by the first document
        self._drain_task: asyncio.Task | None = None

    def launch(self, doc: Document, drive: Callable[[Document], Any], on_end: Callable[[Document], None]) -> None:
        """Run ``drive(doc)`` as the document's task, in flight until it ends; ``on_end(doc)`` runs however it
        ends, even cancelled before its first step (when no finally of it runs)."""
        doc.task = asyncio.create_task(drive(doc))
        self.documents.add(doc)
        doc.task.add_done_callback(lambda _: (self.documents.discard(doc), on_end(doc)))

    @contextlib.asynccontextmanager
    async def slot(self, doc: Document) -> AsyncIterator[None]:
        """The document's slot, once one is free: refused (503) while draining, with the queue full, or past the
        queue timeout."""
        s = self.settings
        if self._slots is None:
            self._slots = asyncio.Semaphore(s.max_documents)
        if self.draining:
            self.counters.rejected += 1
            raise ApiError(503, "the server is shutting down", "server_error", "shutting_down")
        if self._slots.locked() and self.queued >= s.max_queue:
            self.counters.rejected += 1
            raise ApiError(
                503,
                f"server busy: {self.running} documents in flight (the limit) and {self.queued} queued (the queue "
                "limit); retry later",
                "server_error",
                "queue_full",
            )
        doc.state = "queued"
        self.queued += 1
        try:
            async with asyncio.timeout(s.queue_timeout):
                await self._slots.acquire()
        except TimeoutError:
            self.counters.rejected += 1
            raise ApiError(
                503, f"no document slot free within {s.queue_timeout:g} s; retry later", "server_error", "queue_timeout"
            ) from None
        finally:
            self.queued -= 1
        doc.state = "running"
        self.running += 1
        self.counters.documents += 1
        try:
            yield
        finally:
            self.running -= 1
            self._slots.release()
            doc.state = "done"

    def reject(self, doc: Document) -> None:
        """A long request refused once admitted (its body parsed: a 4xx) counts as rejected."""
        doc.counted = "rejected"
        self.counters.rejected += 1

    def counted(self, doc: Document, counter: str) -> None:
        """Count an ended document once; a stream that fails after its document answered moves it to failed."""
        if doc.counted is not None:
            setattr(self.counters, doc.counted, getattr(self.counters, doc.counted) - 1)
        doc.counted = counter
        setattr(self.counters, counter, getattr(self.counters, counter) + 1)

    def stream_failed(self, doc: Document) -> None:
        """The stream of ``doc`` failed while it was written: it counts as failed, whatever its document did (a
        running one is cancelled and counted so)."""
        if doc.task is not None and not doc.task.done():
            doc.cancel("stream failed")
        elif doc.counted is not None:
            self.counted(doc, "failed")

    def status(self) -> dict[str, int]:
        """The documents running and queued, and their limits (``GET /health``)."""
        s = self.settings
        return {
            "running": self.running,
            "queued": self.queued,
            "waiting_for_stream_clients": sum(doc.waiting_for_reader for doc in self.documents),
            "max_documents": s.max_documents,
            "max_queue": s.max_queue,
        }

    # ---- shutdown ----

    def begin_drain(self) -> None:
        """SIGTERM: refuse new documents, cancel the queued ones, give the running ones ``shutdown_grace`` seconds,
        then cancel them (their clients get 503; their upstream requests are closed)."""
        if self.draining:
            return
        self.draining = True
        running = [doc for doc in self.documents if doc.state == "running"]
        for doc in self.documents:
            if doc.state in ("new", "queued"):
                doc.cancel("shutdown")
        log.info("shutting down: %d document(s) in flight get %g s", len(running), self.settings.shutdown_grace)
        self._drain_task = asyncio.create_task(self._drain(running))

    async def _drain(self, running: list[Document]) -> None:
        tasks = [doc.task for doc in running if doc.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=self.settings.shutdown_grace)
        for doc in running:
            doc.cancel("shutdown")
