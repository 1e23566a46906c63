"""The MemAgent service: one request is one run of the served agent (``--agent``, the memory agent by default),
every model call of it sent to the upstream.

What a request becomes follows from the agent's registration, never from its name. An agent with a document column
(a ``large_columns`` entry: the memory agent, the direct baseline) reads one document per request: its question and
document are found by a question mode (:mod:`taskutils.endpoint.questions`). The memory agent of
:func:`recurrent.impls.memory.inference_workflow` reads it chunk by chunk (its chunk progress, long documents kept
on disk, pass-through); any other such agent gets ``{question column: question, document column: document}``. An
agent without one gets the request's messages as its sample (``prompt``: the chat list, as a training row holds it;
``input``: the last user message). Either way its answer is the reply, checked to be its last call's reply
(:func:`recurrent.functions.check_answer`, as in training and the harness). Every call goes upstream
through :class:`recurrent.client.OpenAIChatClient`, driven by :func:`recurrent.async_manager.run_session` (the turn
loop of the harness and the quickstart). Around it, what a service needs: a limit on documents in flight with a
bounded queue, cancellation of a document's remaining turns, timeouts, upstream failures as HTTP statuses that
quote the upstream (:func:`taskutils.endpoint.protocol.upstream_error`), a drain on SIGTERM, counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from recurrent.async_manager import check_finished, run_session
from recurrent.client import ChatRequestError, OpenAIChatClient
from recurrent.functions import AnswerNotLastReplyError
from recurrent.impls.memory import FINAL_TEMPLATES, MemoryEpisode, MemoryWorkflow
from recurrent.interface import Episode, Reply, Turn, WorkflowRegistration, load_register
from recurrent.tokens import SeamError, encode_long, encode_windows
from taskutils.endpoint.protocol import ApiError, ChatRequest, bad_request, upstream_error
from taskutils.endpoint.questions import QUESTION_MODES, Found, QuestionError, find_question
from taskutils.endpoint.spool import MAX_REQUEST_BYTES, SPOOL_BYTES, LongText, Spools, Stopped, as_str

log = logging.getLogger("taskutils.endpoint")

# A message longer than this many characters per token of the chunk budget cannot fit one chunk (no tokenizer's
# token is that long): the pass-through check need not tokenize it.
MAX_CHARS_PER_TOKEN = 64
# A document up to this many characters (~8K tokens) is tokenized on the event loop: a few ms, less than what two
# hand-overs to a worker thread and back cost on a loaded machine (docs/third_party_eval.md). A longer one goes to
# a thread, so that the loop keeps serving the other documents while it is tokenized.
INLINE_TOKENIZE_CHARS = 32_768
# A document on disk whose tokenizer cannot be cut into windows (seams that never agree: recurrent/tokens.py) is
# tokenized whole only up to this many characters (~190 bytes of memory a character while it is encoded: ~200 MB);
# a longer one is refused (413) instead of taking gigabytes (docs/serving.md, "Long requests").
WHOLE_TOKENIZE_CHARS = 1 << 20
# The model's context when neither --max-model-len nor the tokenizer tells it (a tokenizer without a real
# model_max_length, an agent without a tokenizer): 128K tokens, the longest native context of the model families
# served here (docs/serving.md, "What a request costs").
DEFAULT_MODEL_LEN = 131_072
# A tokenizer's model_max_length above this is transformers' "unknown" placeholder (int(1e30)), not a context.
KNOWN_MODEL_LEN = 1 << 24


@dataclass(frozen=True)
class ServeSettings:
    """What a server answers with. Budgets and prompt default to the paper's evaluation protocol (the harness's
    ``memory`` method): 5000-token chunks, 1024-token memory and answer, the whole document, "the answer is"."""

    model: str  # the name clients use (GET /v1/models lists it)
    agent: str = "memory"  # a registered agent's name, or a module or file path (recurrent.interface.load_register)
    # The agent's config fields (--agent-config), set over its inference settings.
    agent_config: Mapping[str, Any] = field(default_factory=dict)
    # The budgets below go to an agent with its own inference builder (the memory agent's); other agents run on
    # their config (docs/serving.md, "Another agent").
    chunk_size: int = 5000
    max_new: int = 1024  # cap on a memory update
    final_max_new: int = 1024  # cap on the answer (a request's max_tokens replaces it)
    max_context: int | None = None  # centre-truncate documents to this many tokens; None: read all
    final_prompt: str = "answer_is"
    question_mode: str = "auto"
    split_marker: str | None = None
    passthrough: bool = False  # a request that fits in one chunk goes upstream as it is
    temperature: float | None = 0.7  # used when a request gives none (the paper's sampling)
    top_p: float | None = 0.95
    max_documents: int = 4  # documents in flight (each has at most one upstream request at a time)
    max_queue: int = 64  # documents waiting for a slot; beyond that: 503
    queue_timeout: float | None = None  # seconds a document may wait for a slot; None: as long as its client
    document_timeout: float | None = None  # seconds a document may run; None: no limit
    shutdown_grace: float = 30.0  # seconds documents in flight get to finish after SIGTERM
    keepalive: float | None = 15.0  # seconds between SSE comments while a streamed document reads; None: none
    spool_bytes: int = SPOOL_BYTES  # a longer request body is held on disk (docs/serving.md, "Long requests")
    max_request_bytes: int | None = MAX_REQUEST_BYTES  # a longer request body is refused (413); None: no limit
    spool_dir: str | None = None  # where its files are made (unlinked at once); None: the system's temp folder
    spool_string_chars: int = 65_536  # in a body on disk, a longer string stays on disk
    tokenize_window: int = 64_000  # a document on disk is tokenized this many characters at a time
    # The model's context in tokens: a request's max_tokens over it is 400; it caps an attempt's timeout. None:
    # the tokenizer's model_max_length, else DEFAULT_MODEL_LEN (context_length).
    max_model_len: int | None = None
    server_key: str | None = field(default=None, repr=False)  # clients must send it (Bearer), when set

    def __post_init__(self) -> None:
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1 (None: the tokenizer's), got {self.max_model_len}")
        for name in ("chunk_size", "max_new", "final_max_new", "max_documents", "spool_string_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.spool_bytes < 0:
            raise ValueError(f"spool_bytes must be >= 0, got {self.spool_bytes}")
        if self.max_request_bytes is not None and self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be >= 1 (None: no limit), got {self.max_request_bytes}")
        if self.tokenize_window < 4:
            raise ValueError(f"tokenize_window must be >= 4, got {self.tokenize_window}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.question_mode not in QUESTION_MODES:
            raise ValueError(f"question_mode must be one of {', '.join(QUESTION_MODES)}, got {self.question_mode!r}")
        if self.final_prompt not in FINAL_TEMPLATES:
            raise ValueError(f"final_prompt must be one of {', '.join(FINAL_TEMPLATES)}, got {self.final_prompt!r}")


@dataclass
class Outcome:
    answer: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    memagent: dict[str, Any]


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

    def progress(self) -> str:
        if self.episode is not None:
            return f"after {len(self.episode.history)} calls"
        if self.session is None:
            return f"while {self.state}"
        return f"after {len(self.session.history)} of {self.session.num_chunks + 1} turns"

    def cancel(self, reason: str) -> None:
        if self.task is not None and not self.task.done():
            self.cancel_reason = self.cancel_reason or reason
            self.task.cancel(reason)


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


def _cut_stop(text: str, stops: list[str]) -> str:
    """OpenAI's answers leave the stop string out; the client appends one an upstream reports (vLLM's
    stop_reason) and some upstreams keep it: cut it."""
    for stop in stops:
        if text.endswith(stop):
            return text[: -len(stop)]
    return text


def context_length(settings: ServeSettings, tokenizer: Any) -> int:
    """The model's context in tokens: ``settings.max_model_len``, else the tokenizer's ``model_max_length`` when it
    is a real one, else :data:`DEFAULT_MODEL_LEN`."""
    if settings.max_model_len is not None:
        return settings.max_model_len
    known = getattr(tokenizer, "model_max_length", None)
    if isinstance(known, int) and 0 < known <= KNOWN_MODEL_LEN:
        return known
    return DEFAULT_MODEL_LEN


def agent_options(settings: ServeSettings, register: WorkflowRegistration) -> dict[str, Any]:
    """The options the served agent is built with (``register.for_inference``): an agent with its own inference
    builder (the memory agent's, whose keywords are the harness's budgets too) takes the server's budgets; every
    agent takes its ``--agent-config`` fields, which win."""
    options: dict[str, Any] = {}
    if register.inference is not None:
        s = settings
        options = {
            "chunk_size": s.chunk_size,
            "max_new": s.max_new,
            "final_max_new": s.final_max_new,
            "max_context": s.max_context,
            "final_prompt": s.final_prompt,
        }
    return {**options, **settings.agent_config}


def describe_config(config: Any, limit: int = 40) -> str:
    """``field=value, ...`` of an agent's config (long values cut), for the start-up line."""
    parts = []
    for f in fields(config):
        value = repr(getattr(config, f.name))
        parts.append(f"{f.name}={value if len(value) <= limit else value[: limit - 3] + '...'}")
    return ", ".join(parts)


class MemAgentService:
    """Documents in flight against one upstream: admission, the turns, cancellation, counters, the drain.
    ``register``: the served agent, when the caller has loaded it already (else ``settings.agent`` is loaded)."""

    def __init__(
        self,
        settings: ServeSettings,
        tokenizer: Any,
        client: OpenAIChatClient,
        register: WorkflowRegistration | None = None,
    ) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.client = client
        self.max_model_len = context_length(settings, tokenizer)
        if client.max_model_len is None:  # a turn's timeout has a ceiling no request lifts
            client.max_model_len = self.max_model_len
        self.register = register if register is not None else load_register(settings.agent)
        self.name = self.register.name
        self.options = agent_options(settings, self.register)
        self.workflow = self.register.for_inference(tokenizer, **self.options)
        # The memory loop (chunk progress, documents kept on disk as ids, pass-through) is that workflow's.
        self.reads_chunks = isinstance(self.workflow, MemoryWorkflow)
        config = self.workflow.config
        large = self.register.large_columns_of(config)
        if len(large) > 1:
            raise ValueError(
                f"agent {self.name!r} reads {len(large)} documents ({', '.join(large)}); a request holds one"
            )
        self.document_column = large[0] if large else None  # None: the agent runs on the request's messages
        self.question_columns = tuple(c for c in self.register.columns_of(config) if c not in large)
        self.reads_documents = self.document_column is not None
        self.counters = Counters()
        self.documents: set[Document] = set()
        self.draining = False
        self.stopped = False  # set once the server has shut down cleanly (the CLI reads it)
        self._slots: asyncio.Semaphore | None = None
        self._queued = 0
        self._running = 0
        self._drain_task: asyncio.Task | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def describe(self) -> str:
        """The agent served and its settings (the start-up line)."""
        config = self.workflow.config
        said = f"agent {self.name!r} ({type(config).__name__}: {describe_config(config)})"
        if self.reads_documents:
            said += f"; question mode {self.settings.question_mode}"
            if self.reads_chunks and self.settings.passthrough:
                said += ", pass-through on"
        return said

    # ---- admission ----

    @contextlib.asynccontextmanager
    async def _slot(self, doc: Document) -> AsyncIterator[None]:
        s = self.settings
        if self._slots is None:
            self._slots = asyncio.Semaphore(s.max_documents)
        if self.draining:
            self.counters.rejected += 1
            raise ApiError(503, "the server is shutting down", "server_error", "shutting_down")
        if self._slots.locked() and self._queued >= s.max_queue:
            self.counters.rejected += 1
            raise ApiError(
                503,
                f"server busy: {self._running} documents in flight (the limit) and {self._queued} queued (the queue "
                "limit); retry later",
                "server_error",
                "queue_full",
            )
        doc.state = "queued"
        self._queued += 1
        try:
            async with asyncio.timeout(s.queue_timeout):
                await self._slots.acquire()
        except TimeoutError:
            self.counters.rejected += 1
            raise ApiError(
                503, f"no document slot free within {s.queue_timeout:g} s; retry later", "server_error", "queue_timeout"
            ) from None
        finally:
            self._queued -= 1
        doc.state = "running"
        self._running += 1
        self.counters.documents += 1
        try:
            yield
        finally:
            self._running -= 1
            self._slots.release()
            doc.state = "done"

    # ---- running ----

    async def start(self, request: ChatRequest, spools: Spools | None = None) -> Document:
        """Start the request's document, its question found first (a 400 before anything waits), unless it
        passes through. The document takes ``spools`` (a long request's files): its task's end closes them; a
        400 here leaves them to the caller."""
        doc = Document(request)
        await self._prepare(doc)
        doc.ready.set()
        return self._launch(doc, spools)

    def start_spooled(self, spools: Spools, parse: Callable[[Spools, threading.Event], ChatRequest]) -> Document:
        """Start a long request that is still its body on disk (``spools.body``): it waits for its slot so, and
        ``parse(spools, stop)`` makes it a request once admitted, in a worker thread that a client that leaves
        stops. Its 400s then come from its task; the task's end closes ``spools``."""
        doc = Document(None)
        doc.parse = parse
        return self._launch(doc, spools)

    async def _prepare(self, doc: Document) -> None:
        """What a request needs before it runs: whether it passes through, else where its question is."""
        request = doc.request
        if not self.reads_documents:
            request.messages = [{**m, "content": as_str(m["content"])} for m in request.messages]
        elif self.reads_chunks and self._passes_through(request, check_tokens=False):
            doc.passthrough = await self._in_thread(doc, self._passes_through, request, True)
        if doc.passthrough:
            request.messages = [{**m, "content": as_str(m["content"])} for m in request.messages]
        elif self.reads_documents:
            doc.found = self._find(request)

    async def _parse(self, doc: Document) -> None:
        """A long request, admitted: parsed from its body on disk, then prepared (its 4xx count as rejected)."""
        try:
            doc.request = await self._in_thread(doc, doc.parse, doc.spools, doc.stop)
            await self._prepare(doc)
        except ApiError as err:
            if err.status < 500:
                doc.counted = "rejected"
                self.counters.rejected += 1
            raise
        doc.ready.set()

    async def _in_thread(self, doc: Document, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` in a worker thread. Cancelled, the document's ``stop`` is set and the thread is
        awaited before the cancellation goes on: the work stops (docs/serving.md, "What a request costs"), and
        the request's files close only once nothing reads them."""
        future = asyncio.ensure_future(asyncio.to_thread(function, *args))
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            doc.stop.set()
            await asyncio.gather(future, return_exceptions=True)
            raise

    def _launch(self, doc: Document, spools: Spools | None) -> Document:
        doc.spools = spools
        doc.task = asyncio.create_task(self._drive(doc))
        self.documents.add(doc)
        # However the task ends, even cancelled before its first step (when no finally of it runs).
        doc.task.add_done_callback(
            lambda _: (
                self.documents.discard(doc),
                self._close_spools(doc),
                doc.events.put_nowait(("end",)),
                doc.ready.set(),
            )
        )
        return doc

    def _find(self, request: ChatRequest) -> Found:
        ext = request.ext
        try:
            return find_question(
                request.user_texts,
                ext.question_mode or self.settings.question_mode,
                ext.split_marker if ext.split_marker is not None else self.settings.split_marker,
                ext.document,
                ext.question,
            )
        except QuestionError as err:
            raise bad_request(str(err), err.param) from None

    def _passes_through(self, request: ChatRequest, check_tokens: bool) -> bool:
        """Whether the request goes upstream as it is: pass-through on (server or request) and every message
        together within one chunk. Without ``check_tokens``, whether it may (the characters allow it)."""
        on = request.ext.passthrough if request.ext.passthrough is not None else self.settings.passthrough
        if not on or request.ext.document is not None:
            return False
        texts = [m["content"] for m in request.messages]
        if sum(len(t) for t in texts) > self.settings.chunk_size * MAX_CHARS_PER_TOKEN:
            return False
        if not check_tokens:
            return True
        tokens = sum(len(self.tokenizer.encode(as_str(t), add_special_tokens=False)) for t in texts)
        return tokens <= self.settings.chunk_size

    def _sampling(self, request: ChatRequest) -> dict[str, Any]:
        defaults = {"temperature": self.settings.temperature, "top_p": self.settings.top_p}
        return {**{k: v for k, v in defaults.items() if v is not None}, **request.sampling}

    async def _drive(self, doc: Document) -> Outcome:
        began = time.perf_counter()
        try:
            async with self._slot(doc):
                try:
                    async with asyncio.timeout(self.settings.document_timeout):
                        if doc.request is None:
                            await self._parse(doc)
                        if doc.passthrough:
                            outcome = await self._pass_through(doc)
                        elif self.reads_chunks:
                            outcome = await self._read(doc)
                        else:
                            outcome = await self._run(doc)
                except TimeoutError:
                    raise ApiError(
                        504,
                        f"the document was not answered within {self.settings.document_timeout:g} s (the server's "
                        f"document timeout), {doc.progress()}",
                        "server_error",
                        "document_timeout",
                    ) from None
                except ChatRequestError as err:
                    raise upstream_error(err, f"upstream failure {doc.progress()}") from None
                except AnswerNotLastReplyError as err:  # the agent's fault, named as the harness names it
                    raise ApiError(500, str(err), "server_error", "answer_not_last_reply") from None
        except asyncio.CancelledError:
            if doc.cancel_reason == "stream failed":
                self._counted(doc, "failed")
            else:
                self._counted(doc, "cancelled")
            log.info("%s cancelled (%s) %s", doc.id, doc.cancel_reason or "cancelled", doc.progress())
            raise
        except ApiError as err:
            if doc.state != "new" and doc.state != "queued" and doc.counted is None:
                self._counted(doc, "failed")
            log.warning("%s answered %d: %s", doc.id, err.status, err.message)
            raise
        except Exception as err:
            self._counted(doc, "failed")
            log.exception("%s failed %s", doc.id, doc.progress())
            raise ApiError(
                500, f"internal error {doc.progress()}: {type(err).__name__}: {err}", "server_error"
            ) from err
        self._counted(doc, "completed")
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

    async def _pass_through(self, doc: Document) -> Outcome:
        request = doc.request
        sampling = self._sampling(request)
        if request.stop:
            sampling["stop"] = request.stop
        reply = await self.client.chat(request.messages, request.max_tokens or self.settings.final_max_new, **sampling)
        self._count(reply)
        answer = _cut_stop(reply.text, request.stop) if reply.finish_reason == "stop" else reply.text
        memagent = {"passthrough": True, "turns": 1}
        return Outcome(answer, reply.finish_reason, reply.prompt_tokens, reply.completion_tokens, memagent)

    def _sample(self, doc: Document) -> dict[str, Any]:
        """The agent's sample of a request: the question and the document in the agent's columns (an agent that
        reads one), or the conversation: the messages as ``prompt`` (the chat list a training row holds) and the
        last user message as ``input``."""
        request, found = doc.request, doc.found
        if found is None:
            users = [m["content"] for m in request.messages if m.get("role") == "user"]
            return {"prompt": [dict(m) for m in request.messages], "input": users[-1] if users else ""}
        question = as_str(found.question).strip()
        sample: dict[str, Any] = dict.fromkeys(self.question_columns, question)
        sample[self.document_column] = as_str(found.document).strip()  # this agent takes the document whole
        doc.found = Found("", found.question, found.mode)
        request.drop_texts()
        return sample

    async def _run(self, doc: Document) -> Outcome:
        """Any agent but the memory loop: one episode on the request's sample; each call a progress event."""
        request = doc.request
        sample = self._sample(doc)
        long = self.document_column is not None and len(sample[self.document_column]) > INLINE_TOKENIZE_CHARS
        try:  # a long document is tokenized in a worker thread, as the memory agent's is
            doc.episode = (
                await self._in_thread(doc, self.workflow.episode, sample) if long else self.workflow.episode(sample)
            )
        except (KeyError, ValueError, TypeError) as err:
            raise bad_request(f"agent {self.name!r} cannot run this request: {err}") from None
        del sample
        calls = 0

        def on_turn(turn: Turn, reply: Reply) -> None:
            nonlocal calls
            calls += 1
            self._count(reply)
            if request.stream:  # one progress event per call (docs/serving.md, "Streaming")
                kind = str(turn.meta.get("kind", "call"))
                progress = {
                    "agent": self.name,
                    "call": calls,
                    "kind": kind,
                    "finish_reason": reply.finish_reason,
                    "prompt_tokens": reply.prompt_tokens,
                    "completion_tokens": reply.completion_tokens,
                }
                doc.events.put_nowait(("progress", progress, f"call {calls} ({kind}) answered"))

        final = {"stop": request.stop} if request.stop else None  # for a call flagged final (known to be the answer)
        await run_session(doc.episode, self.client, self._sampling(request), on_turn, final)
        check_finished(doc.episode)
        history = doc.episode.history
        last = history[-1]
        info: dict[str, Any] = {"agent": self.name, "turns": len(history)}
        if doc.found is not None:
            info["question_mode"] = doc.found.mode
        answer = doc.episode.answer
        if final is not None and last.turn.final and last.reply.finish_reason == "stop":
            answer = _cut_stop(answer, request.stop)
        return Outcome(
            answer,
            last.reply.finish_reason,
            sum(rec.reply.prompt_tokens for rec in history),
            sum(rec.reply.completion_tokens for rec in history),
            info,
        )

    def _spooled_session(
        self, workflow: MemoryWorkflow, question: str, document: LongText, spools: Spools, stop: threading.Event
    ) -> MemoryEpisode:
        """The episode of a document held on disk: ``workflow.episode({"input": question, "context": document})``
        with the ids written to a file window by window (exactly ``encode_long``'s ids) and mapped, not held;
        ``stop`` set (the document cancelled) ends it at the next window with :class:`Stopped`."""
        context = document.strip()  # what the workflow's context_text does (strip_context)
        ids = spools.new_ids()
        window = self.settings.tokenize_window
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        try:
            if backend is None or len(context) <= window:
                raise SeamError("no fast tokenizer" if backend is None else "one window")
            for part in encode_windows(context, backend, window, min(1_000, window // 4)):
                if stop.is_set():
                    raise Stopped("tokenizing stopped")
                ids.write(part)
        except SeamError as err:
            if backend is not None and len(context) > window:
                if len(context) > WHOLE_TOKENIZE_CHARS:
                    raise ApiError(
                        413,
                        f"the document ({len(context):,} characters) cannot be tokenized window by window ({err}) "
                        f"and is over the {WHOLE_TOKENIZE_CHARS:,} characters tokenized whole",
                        code="document_too_large",
                    ) from None
                log.warning("%s; the %d-character document is tokenized whole, in memory", err, len(context))
            ids.close()
            ids = spools.new_ids()
            ids.write(encode_long(str(context), self.tokenizer))
        spools.text.close()  # the text is read: its file goes
        return workflow.episode_from_ids(question, ids.array())

    def _close_spools(self, doc: Document) -> None:
        """A long request's files close with its task; the episode's ids, mapped from one of them, go first."""
        if doc.spools is None:
            return
        if doc.session is not None and doc.spools.ids is not None:
            reading = doc.session.reading
            reading.context_ids = reading.context_ids[:0].copy()  # nothing reads them after the task
        doc.spools.close()

    def _counted(self, doc: Document, counter: str) -> None:
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
            self._counted(doc, "failed")

    def _count(self, reply: Reply) -> None:
        self.counters.turns += 1
        self.counters.prompt_tokens += reply.prompt_tokens
        self.counters.completion_tokens += reply.completion_tokens

    async def _read(self, doc: Document) -> Outcome:
        request, found = doc.request, doc.found
        workflow = self.workflow
        if request.max_tokens is not None:  # the request's answer budget
            workflow = self.register.for_inference(
                self.tokenizer, **{**self.options, "max_final_response_length": request.max_tokens}
            )
        # A long document is held once: the request's texts go before it is stripped (a copy when its edges
        # are blank) and it goes once tokenized; the session holds the ids (docs/third_party_eval.md).
        document, question = found.document, found.question.strip()
        doc.found = found = Found("", found.question, found.mode)
        request.drop_texts()
        try:
            if isinstance(document, LongText):  # on disk: tokenized into a file of ids, read back a chunk at a time
                doc.session = await self._in_thread(
                    doc, self._spooled_session, workflow, question, document, doc.spools, doc.stop
                )
            else:
                sample = {"input": question, "context": document.strip()}  # as the harness builds its items
                del document
                if len(sample["context"]) <= INLINE_TOKENIZE_CHARS:
                    doc.session = workflow.episode(sample)
                else:
                    doc.session = await self._in_thread(doc, workflow.episode, sample)
                del sample
        except ValueError as err:
            raise bad_request(f"cannot read this document: {err}") from None
        document = None
        ids = doc.spools.ids if doc.spools is not None else None

        def on_turn(turn: Turn, reply: Reply) -> None:
            if ids is not None:
                ids.release()  # the chunk read leaves resident memory: the ids stay on disk
            self._count(reply)
            if not request.stream:
                return
            if turn.final:  # the answer follows: no progress of its own
                doc.events.put_nowait(("progress", None, None))
                return
            # A stream reports each chunk read; the event holds no prompt (docs/serving.md, "Streaming").
            chunk = turn.meta["chunk"] + 1
            progress: dict[str, Any] = {"chunk": chunk, "chunks": doc.session.num_chunks}
            if request.ext.return_memories:
                progress["memory"] = doc.session.reading.memory_of(reply).text  # the agent keeps it once resumed
            doc.events.put_nowait(("progress", progress, f"read chunk {chunk} of {doc.session.num_chunks}"))

        final = {"stop": request.stop} if request.stop else None
        session = await run_session(doc.session, self.client, self._sampling(request), on_turn, final)
        check_finished(session)
        history = session.history
        last = history[-1].reply
        memory_turns = [rec for rec in history if not rec.turn.final]
        memagent: dict[str, Any] = {
            "question_mode": found.mode,
            "document_tokens": session.original_context_tokens,
            "document_tokens_read": len(session.context_ids),
            "chunks": session.num_chunks,
            "turns": len(history),
            "memory_truncated": sum(rec.reply.finish_reason == "length" for rec in memory_turns),
        }
        if request.ext.return_memories:
            memagent["memories"] = list(session.memory_trace)
        answer = _cut_stop(last.text, request.stop) if last.finish_reason == "stop" else last.text
        return Outcome(
            answer,
            last.finish_reason,
            sum(rec.reply.prompt_tokens for rec in history),
            sum(rec.reply.completion_tokens for rec in history),
            memagent,
        )

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

    # ---- status ----

    async def health(self) -> tuple[int, dict[str, Any]]:
        upstream: dict[str, Any] = {"url": self.client.base_url, "model": self.client.model}
        status = 200
        try:
            await self.client.list_models()
            upstream["reachable"] = True
        except ChatRequestError as err:
            # Any HTTP answer means it is up (a hosted deployment URL may have no /models); no answer: 503.
            upstream["reachable"] = err.status_code is not None
            upstream["error"] = str(err)
            if err.status_code is None:
                status = 503
        s = self.settings
        body = {
            "status": "shutting down" if self.draining else ("ok" if status == 200 else "upstream unreachable"),
            "model": s.model,
            "upstream": upstream,
            "documents": {
                "running": self._running,
                "queued": self._queued,
                "max_documents": s.max_documents,
                "max_queue": s.max_queue,
            },
            "counters": vars(self.counters),
        }
        return (503 if self.draining else status), body
