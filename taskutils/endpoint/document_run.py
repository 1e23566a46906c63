"""One admitted request's run of the served agent: what the request is to the agent, its episode built (a long
document tokenized off the event loop, or window by window from disk), its turns run against the upstream, and the
outcome answered. Whether and when a request runs is :mod:`taskutils.endpoint.admission`'s.

What a request becomes follows from the agent's registration, never from its name. An agent with a document column
(a ``large_columns`` entry: the memory agent, the direct baseline) reads one document per request: its question and
document are found by a question mode (:mod:`taskutils.endpoint.questions`). The memory agent of
:func:`recurrent.impls.memory.inference_workflow` reads it chunk by chunk (its chunk progress, long documents kept
on disk, pass-through); any other such agent gets ``{question column: question, document column: document}``. An
agent without one gets the request's messages as its sample (``prompt``: the chat list, as a training row holds it;
``input``: the last user message). Either way its answer is the reply, checked to be its last call's reply
(:func:`recurrent.functions.check_answer`, as in training and the harness), and every turn runs through
:func:`recurrent.async_manager.run_session` (the turn loop of the harness and the quickstart).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from recurrent.async_manager import check_finished, run_session
from recurrent.client import OpenAIChatClient
from recurrent.impls.memory import MemoryWorkflow
from recurrent.impls.memory_episode import MemoryEpisode
from recurrent.interface import Reply, Turn, WorkflowRegistration
from recurrent.sampling import call_sampling
from recurrent.tokens import MAX_CHARS_PER_TOKEN, SeamError, encode_long, encode_windows
from taskutils.endpoint.admission import Counters, Document
from taskutils.endpoint.protocol import ApiError, ChatRequest, bad_request
from taskutils.endpoint.questions import Found, QuestionError, find_question
from taskutils.endpoint.settings import ServeSettings
from taskutils.endpoint.spool import LongText, Spools, Stopped, as_str

log = logging.getLogger("taskutils.endpoint")

# A document up to this many characters (~8K tokens) is tokenized on the event loop: a few ms, less than what two
# hand-overs to a worker thread and back cost on a loaded machine (docs/third_party_eval.md). A longer one goes to
# a thread, so that the loop keeps serving the other documents while it is tokenized.
INLINE_TOKENIZE_CHARS = 32_768
# A document on disk whose tokenizer cannot be cut into windows (seams that never agree: recurrent/tokens.py) is
# tokenized whole only up to this many characters (~190 bytes of memory a character while it is encoded: ~200 MB);
# a longer one is refused (413) instead of taking gigabytes (docs/serving.md, "Long requests").
WHOLE_TOKENIZE_CHARS = 1 << 20


@dataclass
class Outcome:
    answer: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    memagent: dict[str, Any]


def _cut_stop(text: str, stops: list[str]) -> str:
    """OpenAI's answers leave the stop string out; the client appends one an upstream reports (vLLM's
    stop_reason) and some upstreams keep it: cut it."""
    for stop in stops:
        if text.endswith(stop):
            return text[: -len(stop)]
    return text


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


class DocumentRunner:
    """The served agent, built once from its registration, and the run of each admitted document on it: every
    upstream reply counted in ``counters``."""

    def __init__(
        self,
        settings: ServeSettings,
        tokenizer: Any,
        client: OpenAIChatClient,
        register: WorkflowRegistration,
        counters: Counters,
    ) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.client = client
        self.counters = counters
        self.register = register
        self.name = register.name
        self.options = agent_options(settings, register)
        self.workflow = register.for_inference(tokenizer, **self.options)
        # The memory loop (chunk progress, documents kept on disk as ids, pass-through) is that workflow's.
        self.reads_chunks = isinstance(self.workflow, MemoryWorkflow)
        config = self.workflow.config
        large = register.large_columns_of(config)
        if len(large) > 1:
            raise ValueError(
                f"agent {self.name!r} reads {len(large)} documents ({', '.join(large)}); a request holds one"
            )
        self.document_column = large[0] if large else None  # None: the agent runs on the request's messages
        self.question_columns = tuple(c for c in register.columns_of(config) if c not in large)
        self.reads_documents = self.document_column is not None

    def describe(self) -> str:
        """The agent served and its settings (the start-up line)."""
        config = self.workflow.config
        said = f"agent {self.name!r} ({type(config).__name__}: {describe_config(config)})"
        if self.reads_documents:
            said += f"; question mode {self.settings.question_mode}"
            if self.reads_chunks and self.settings.passthrough:
                said += ", pass-through on"
        return said

    # ---- before the turns ----

    async def prepare(self, doc: Document) -> None:
        """What a request needs before it runs: whether it passes through, else where its question is."""
        request = doc.request
        if not self.reads_documents:
            if not request.user_texts:  # the agent's sample is the conversation, its input the last user message
                raise bad_request("messages hold no user message: the agent answers the last one", "messages")
            request.messages = [{**m, "content": as_str(m["content"])} for m in request.messages]
        elif self.reads_chunks and self._passes_through(request, check_tokens=False):
            doc.passthrough = await self.in_thread(doc, self._passes_through, request, True)
        if doc.passthrough:
            request.messages = [{**m, "content": as_str(m["content"])} for m in request.messages]
        elif self.reads_documents:
            doc.found = self._find(request)

    async def parse(self, doc: Document) -> None:
        """A long request, admitted: parsed from its body on disk, then prepared."""
        doc.request = await self.in_thread(doc, doc.parse, doc.spools, doc.stop)
        await self.prepare(doc)

    async def in_thread(self, doc: Document, function: Callable[..., Any], *args: Any) -> Any:
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
        # A message longer than this cannot fit one chunk: the check need not tokenize it.
        if sum(len(t) for t in texts) > self.settings.chunk_size * MAX_CHARS_PER_TOKEN:
            return False
        if not check_tokens:
            return True
        tokens = sum(len(self.tokenizer.encode(as_str(t), add_special_tokens=False)) for t in texts)
        return tokens <= self.settings.chunk_size

    # ---- the turns ----

    async def run(self, doc: Document) -> Outcome:
        """The prepared document's outcome: upstream as it is, the memory agent's reading, or any agent's run."""
        if doc.passthrough:
            return await self._pass_through(doc)
        if self.reads_chunks:
            return await self._read(doc)
        return await self._run_agent(doc)

    def _sampling(self, request: ChatRequest) -> dict[str, Any]:
        """The request's sampling over the server's, by the one rule (recurrent/sampling.py): a request that sets
        temperature or top_p gets 1.0 for the other, one that sets neither the server's --temperature/--top-p."""
        defaults = {"temperature": self.settings.temperature, "top_p": self.settings.top_p}
        return call_sampling(defaults, request.sampling)

    def _count(self, reply: Reply) -> None:
        self.counters.turns += 1
        self.counters.prompt_tokens += reply.prompt_tokens
        self.counters.completion_tokens += reply.completion_tokens

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

    async def _run_agent(self, doc: Document) -> Outcome:
        """Any agent but the memory loop: one episode on the request's sample; each call a progress event."""
        request = doc.request
        sample = self._sample(doc)
        long = self.document_column is not None and len(sample[self.document_column]) > INLINE_TOKENIZE_CHARS
        try:  # a long document is tokenized in a worker thread, as the memory agent's is
            doc.episode = (
                await self.in_thread(doc, self.workflow.episode, sample) if long else self.workflow.episode(sample)
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
        await run_session(doc.episode, doc.paced(self.client), self._sampling(request), on_turn, final)
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

    # ---- the memory agent's reading ----

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

    def close_spools(self, doc: Document) -> None:
        """A long request's files close with its task; the episode's ids, mapped from one of them, go first."""
        if doc.spools is None:
            return
        if doc.session is not None and doc.spools.ids is not None:
            reading = doc.session.reading
            reading.context_ids = reading.context_ids[:0].copy()  # nothing reads them after the task
        doc.spools.close()

    async def _episode(self, doc: Document, workflow: MemoryWorkflow) -> None:
        """The memory agent's episode of the document: held once (the request's texts go before it is stripped, a
        copy when its edges are blank, and it goes once tokenized; the session holds the ids:
        docs/third_party_eval.md)."""
        document, question = doc.found.document, doc.found.question.strip()
        doc.found = Found("", doc.found.question, doc.found.mode)
        doc.request.drop_texts()
        try:
            if isinstance(document, LongText):  # on disk: tokenized into a file of ids, read back a chunk at a time
                doc.session = await self.in_thread(
                    doc, self._spooled_session, workflow, question, document, doc.spools, doc.stop
                )
            else:
                sample = {"input": question, "context": document.strip()}  # as the harness builds its items
                del document
                if len(sample["context"]) <= INLINE_TOKENIZE_CHARS:
                    doc.session = workflow.episode(sample)
                else:
                    doc.session = await self.in_thread(doc, workflow.episode, sample)
                del sample
        except ValueError as err:
            raise bad_request(f"cannot read this document: {err}") from None

    async def _read(self, doc: Document) -> Outcome:
        request = doc.request
        workflow = self.workflow
        if request.max_tokens is not None:  # the request's answer budget
            workflow = self.register.for_inference(
                self.tokenizer, **{**self.options, "max_final_response_length": request.max_tokens}
            )
        await self._episode(doc, workflow)
        found = doc.found  # its question and mode: the document is the session's ids now
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
        session = await run_session(doc.session, doc.paced(self.client), self._sampling(request), on_turn, final)
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
