"""The MemAgent service: one request is one run of the served agent (``--agent``, the memory agent by default),
every model call of it sent to the upstream through :class:`recurrent.client.OpenAIChatClient`.

A request's life, in the order it runs: :meth:`MemAgentService.start` (its question found, or a long request's body
left on disk), a slot among the documents in flight or a place in the bounded queue
(:mod:`taskutils.endpoint.admission`), then its run on the agent (:mod:`taskutils.endpoint.document_run`: the
episode built, the turns, the outcome), within the document timeout. Around it, what a service needs: upstream
failures as HTTP statuses that quote the upstream (:func:`taskutils.endpoint.protocol.upstream_error`), every
document counted once when it ends, a drain on SIGTERM, ``GET /health``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from recurrent.client import ChatRequestError, OpenAIChatClient
from recurrent.functions import AnswerNotLastReplyError
from recurrent.interface import WorkflowRegistration, load_register
from taskutils.endpoint.admission import Admission, Document
from taskutils.endpoint.connections import Connections
from taskutils.endpoint.document_run import DocumentRunner, Outcome
from taskutils.endpoint.protocol import ApiError, ChatRequest, upstream_error
from taskutils.endpoint.settings import ServeSettings, context_length
from taskutils.endpoint.spool import Spools

log = logging.getLogger("taskutils.endpoint")

HEALTH_TIMEOUT = 5.0  # seconds for the upstream to take /health's connection, and as many to answer on it


class MemAgentService:
    """Documents in flight against one upstream: admitted (``admission``), run (``runner``), counted, drained.
    ``register``: the served agent, when the caller has loaded it already (else ``settings.agent`` is loaded)."""

    def __init__(
        self,
        settings: ServeSettings,
        tokenizer: Any,
        client: OpenAIChatClient,
        register: WorkflowRegistration | None = None,
    ) -> None:
        self.settings = settings
        self.client = client
        self.max_model_len = context_length(settings, tokenizer)
        if client.max_model_len is None:  # a turn's timeout has a ceiling no request lifts
            client.max_model_len = self.max_model_len
        self.admission = Admission(settings)
        register = register if register is not None else load_register(settings.agent)
        self.runner = DocumentRunner(settings, tokenizer, client, register, self.admission.counters)
        self.stopped = False  # set once the server has shut down cleanly (the CLI reads it)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.connections: Connections | None = None  # the server's, once it serves (GET /health reports them)

    def describe(self) -> str:
        """The agent served and its settings (the start-up line)."""
        return self.runner.describe()

    # ---- a request's start ----

    async def start(self, request: ChatRequest, spools: Spools | None = None) -> Document:
        """Start the request's document, its question found first (a 400 before anything waits), unless it
        passes through. The document takes ``spools`` (a long request's files): its task's end closes them; a
        400 here leaves them to the caller."""
        doc = Document(request)
        await self.runner.prepare(doc)
        doc.ready.set()
        return self._launch(doc, spools)

    def start_spooled(self, spools: Spools, parse: Callable[[Spools, threading.Event], ChatRequest]) -> Document:
        """Start a long request that is still its body on disk (``spools.body``): it waits for its slot so, and
        ``parse(spools, stop)`` makes it a request once admitted, in a worker thread that a client that leaves
        stops. Its 400s then come from its task; the task's end closes ``spools``."""
        doc = Document(None)
        doc.parse = parse
        return self._launch(doc, spools)

    def _launch(self, doc: Document, spools: Spools | None) -> Document:
        doc.spools = spools
        self.admission.launch(doc, self._drive, self._ended)
        return doc

    def _ended(self, doc: Document) -> None:
        self.runner.close_spools(doc)
        doc.events.put_nowait(("end",))
        doc.ready.set()

    async def _parse(self, doc: Document) -> None:
        """A long request, admitted: parsed from its body on disk, then prepared (its 4xx count as rejected)."""
        try:
            await self.runner.parse(doc)
        except ApiError as err:
            if err.status < 500:
                self.admission.reject(doc)
            raise
        doc.ready.set()

    # ---- a document's life ----

    async def _drive(self, doc: Document) -> Outcome:
        began = time.perf_counter()
        admission = self.admission
        try:
            async with admission.slot(doc):
                try:
                    async with asyncio.timeout(self.settings.document_timeout):
                        if doc.request is None:
                            await self._parse(doc)
                        outcome = await self.runner.run(doc)
                except TimeoutError:
                    raise ApiError(
                        504,
                        f"the document was not answered within {self.settings.document_timeout:g} s (the server's "
                        f"--document-timeout), {doc.progress()}",
                        "server_error",
                        "document_timeout",
                    ) from None
                except ChatRequestError as err:
                    raise upstream_error(err, f"upstream failure {doc.progress()}") from None
                except AnswerNotLastReplyError as err:  # the agent's fault, named as the harness names it
                    raise ApiError(500, str(err), "server_error", "answer_not_last_reply") from None
        except asyncio.CancelledError:
            admission.counted(doc, "failed" if doc.cancel_reason == "stream failed" else "cancelled")
            log.info("%s cancelled (%s) %s", doc.id, doc.cancel_reason or "cancelled", doc.progress())
            raise
        except ApiError as err:
            if doc.state != "new" and doc.state != "queued" and doc.counted is None:
                admission.counted(doc, "failed")
            log.warning("%s answered %d: %s", doc.id, err.status, err.message)
            raise
        except Exception as err:
            admission.counted(doc, "failed")
            log.exception("%s failed %s", doc.id, doc.progress())
            raise ApiError(
                500, f"internal error {doc.progress()}: {type(err).__name__}: {err}", "server_error"
            ) from err
        admission.counted(doc, "completed")
        log.info(
            "%s answered: %s, %d turns, %d+%d tokens, %.2f s",
            doc.id,
            outcome.memagent.get("question_mode", outcome.memagent.get("agent", "passthrough")),
            outcome.memagent["turns"],
            outcome.prompt_tokens,
            outcome.completion_tokens,
            time.perf_counter() - began,
        )
        return outcome

    def stream_failed(self, doc: Document) -> None:
        """The stream of ``doc`` failed while it was written: it counts as failed (:meth:`Admission.stream_failed`)."""
        self.admission.stream_failed(doc)

    def begin_drain(self) -> None:
        """SIGTERM: the drain (:meth:`Admission.begin_drain`)."""
        self.admission.begin_drain()

    # ---- status ----

    async def health(self) -> tuple[int, dict[str, Any]]:
        """``GET /health``: the upstream checked on a connection of its own (never behind the documents' calls),
        the documents and the counters. 200 "ok", or "busy" (every document slot taken, or the upstream took the
        connection but did not answer in time); 503 "upstream unreachable" (no connection) or "shutting down"."""
        check = await self.client.check_upstream(HEALTH_TIMEOUT)
        upstream: dict[str, Any] = {"url": self.client.base_url, "model": self.client.model}
        upstream["reachable"], upstream["busy"] = check.reachable, check.busy
        if check.error is not None:
            upstream["error"] = check.error
        documents = self.admission.status()
        if self.admission.draining:
            status, said = 503, "shutting down"
        elif not check.reachable:
            status, said = 503, "upstream unreachable"
        elif check.busy or documents["running"] >= documents["max_documents"]:
            status, said = 200, "busy"
        else:
            status, said = 200, "ok"
        body = {
            "status": said,
            "model": self.settings.model,
            "upstream": upstream,
            "documents": documents,
            "counters": vars(self.admission.counters),
        }
        if self.connections is not None:
            body["connections"] = self.connections.status()
        return status, body
