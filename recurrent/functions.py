"""Agents written as plain async functions ("agent as a function").

An agent function receives one sample (a dict of columns), a chat client and its config, calls the model as often
as it likes with any control flow, and returns its answer::

    @dataclass
    class EchoConfig(WorkflowConfig):
        max_tokens: int = 64

    async def echo(sample: dict, client: ChatClient, config: EchoConfig) -> str:
        reply = await client.chat([{"role": "user", "content": sample["prompt"]}], config.max_tokens)
        return reply.text

    REGISTER = agent_function("echo", EchoConfig, echo, columns=("prompt",))

No tokenization, padding or state machine: the framework hands the function a :class:`CallRecorder` around
whatever client the run uses (an OpenAI-compatible server for evaluation and serving, verl's rollout servers in
training, the lockstep barrier of sync mode), and records every call as one :class:`~recurrent.interface.TurnRecord`.
In training each call becomes one row holding the exact prompt ids the policy saw (the messages rendered by the
tokenizer's chat template, or the ``prompt_ids`` the agent built itself) and the ids it sampled, and the sample's one
reward and advantage go on every row. The reward scores the *last* call's reply, so an agent returns that reply's
text as its answer: :func:`check_answer` is that rule, checked wherever an episode finishes (training, the evaluation
harness, the endpoint), so a mismatch fails the same way everywhere.

A call may say more than its messages (:meth:`CallRecorder.chat`): ``prompt_ids``, the same prompt in token space
(token-in backends send it as is); ``final=True``, that it is the answer, known before it is made (sync mode holds
such calls until no agent of the batch has any other call left, and the client's answer-only sampling, such as a
request's stop strings, applies to it); ``kind`` and ``meta``, facts about it for traces and training rows; its own
sampling (``temperature=...``), recorded with it. Calls may be made at once (``asyncio.gather``); each one the agent
starts is awaited before it returns (a call left running would belong to an episode that has ended: refused). An
agent may return :class:`Answer` (its text and its own score of the run) instead of the text alone.

An agent whose samples need work before it runs (a long document tokenized once, off the event loop) subclasses
:class:`FunctionWorkflow` and overrides :meth:`~FunctionWorkflow.prepare`: its function then receives what
``prepare`` returns as its sample (the memory agent: recurrent/impls/memory.py).
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import math
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from recurrent.interface import (
    ChatClient,
    Columns,
    Episode,
    Reply,
    RowWidths,
    Turn,
    TurnRecord,
    Workflow,
    WorkflowConfig,
    WorkflowRegistration,
    stop_requested,
)
from recurrent.sampling import own_sampling

ANSWER_KIND = "final"  # the kind of a call flagged final, unless it names its own

# A hold on each reply until the agent awaits its call, given the episode's task: set only by the preflight's trial
# episode (verl_ext/agent_probe.py), so that a call left running is still running when the agent returns however
# fast its model answered. Unset, replies go to the agent as they come.
ReplyGate = Callable[["asyncio.Task[Any] | None"], Awaitable[None]]
REPLY_GATE: contextvars.ContextVar[ReplyGate | None] = contextvars.ContextVar("reply_gate", default=None)

CallSite = list[tuple[str, int]]  # (file, line) of the frames that made a call, the most recent first


def call_site(depth: int = 64) -> CallSite:
    """Where the running call was made: the frames of the current stack (an agent that awaits its call, or a helper
    coroutine of its file), then where the running task's coroutine was created (a call the agent handed to
    ``asyncio.ensure_future`` or ``gather``: known where ``sys.set_coroutine_origin_tracking_depth`` is on)."""
    frames: CallSite = []
    frame = sys._getframe(1)
    while frame is not None and len(frames) < depth:
        frames.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    task = asyncio.current_task()
    origin = getattr(task.get_coro(), "cr_origin", None) if task is not None else None
    return frames + [(file, line) for file, line, _ in origin or ()]


class CallLeftRunningError(RuntimeError):
    """An agent returned with calls it started still running; ``call_sites``: where each was made."""

    def __init__(self, message: str, call_sites: list[CallSite]) -> None:
        super().__init__(message)
        self.call_sites = call_sites


class AnswerNotLastReplyError(RuntimeError):
    """An episode's answer is not its last model call's reply (:func:`check_answer`)."""


def check_answer(episode: Episode) -> None:
    """The one rule that an episode's answer is its last call's reply: training rewards the last call's row, so an
    answer that differs would be scored on text the policy never produced there. Training, the evaluation harness
    and the endpoint all call it (through :func:`recurrent.async_manager.check_finished`), so a mismatch fails
    the same way in each (docs/write_your_own_agent.md)."""
    history = episode.history
    answer = episode.answer
    if not history or answer is None or answer == history[-1].reply.text:
        return
    name = getattr(episode, "name", None)
    who = f"agent {name!r}" if name else "the agent"
    raise AnswerNotLastReplyError(
        f"the agent's answer is not its last call's reply ({who}, {len(history)} calls: it returned "
        f"{_excerpt(answer)}, its last reply was {_excerpt(history[-1].reply.text)}); training rewards the last "
        "call's row, so an agent returns that reply's text (docs/write_your_own_agent.md)"
    )


def _excerpt(text: str, limit: int = 60) -> str:
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


@dataclass(frozen=True)
class Answer:
    """What an agent function may return in place of its answer's text: the text (its last call's reply, as ever)
    and the agent's own score of its run, which a training reward function reads (``verl_ext.rewards``:
    ``agent_score``; docs/write_your_own_agent.md, "A reward over the whole trajectory")."""

    text: str
    score: float | None = None

    def __post_init__(self) -> None:
        if self.score is not None and (
            isinstance(self.score, bool) or not isinstance(self.score, int | float) or not math.isfinite(self.score)
        ):
            raise ValueError(f"an agent's score is a finite number, got {self.score!r}")


AgentFunction = Callable[[Any, "CallRecorder", Any], Awaitable["str | Answer"]]  # (sample, client, config) -> answer
RowWidthsOf = Callable[[Any, Any], RowWidths]  # (config, tokenizer) -> the widest call


class CallRecorder:
    """The client an agent function receives: each call goes to the run's client and is recorded, in the order the
    calls were made. Without ``keep_prompts`` a record keeps the facts of a call (budget, kind, token counts), not its
    prompt or ids: a pass over a document of any length then holds one chunk at a time (inference)."""

    def __init__(
        self,
        client: ChatClient,
        sampling: dict[str, Any] | None = None,
        on_turn: Callable[[Turn, Reply], None] | None = None,
        final_sampling: dict[str, Any] | None = None,
        keep_prompts: bool = True,
    ) -> None:
        self._client = client
        self._sampling = dict(sampling or {})
        self._final_sampling = {**self._sampling, **(final_sampling or {})}
        self._on_turn = on_turn
        self._keep_prompts = keep_prompts
        self._send_turn = getattr(client, "send_turn", None)  # a TurnClient (the lockstep barrier)
        self.history: list[TurnRecord] = []  # in the order the calls were made (a stable order, whatever answers first)
        self._made: list[int] = []  # the index in ``sites`` of each record of ``history``
        self.in_flight = 0  # calls made and not yet answered (an agent returns only once none is left)
        self.sites: list[CallSite] = []  # where each call was made, in the order they were made
        self.open: set[int] = set()  # the calls (indices into sites) not yet answered
        # The most prompt tokens a call may have (its episode's): an agent that renders its own prompts (the openai
        # route in training) refuses a longer one by its characters before tokenizing it (recurrent/templating.py).
        self.max_prompt_tokens: int | None = None
        try:
            self._task = asyncio.current_task()  # the episode's: a call awaited elsewhere was handed to a task
        except RuntimeError:
            self._task = None

    async def chat(
        self,
        messages: list[dict[str, str]],
        max_tokens: int,
        *,
        kind: str | None = None,
        final: bool = False,
        prompt_ids: list[int] | None = None,
        meta: dict[str, Any] | None = None,
        **sampling: Any,
    ) -> Reply:
        """One model call: ``messages`` (OpenAI chat format) in, a :class:`~recurrent.interface.Reply` out.

        ``prompt_ids``: the same prompt in token space, chat template included (a token-in backend sends it instead
        of templating ``messages``; an HTTP endpoint never sees it). ``final``: this call is the answer, known in
        advance (the agent returns its reply; sync mode holds it for the last round). ``kind`` names the call in
        traces and training rows (default "call", "final" for a final one); ``meta``: more facts for them."""
        messages = [dict(message) for message in messages]  # the record keeps what was sent, not later edits
        # the ids as they are now: a lockstep round reads them later, an agent's thread runs on meanwhile
        prompt_ids = None if prompt_ids is None else list(prompt_ids)
        kind = kind if kind is not None else ANSWER_KIND if final else "call"
        meta = {"kind": kind, **(meta or {})}
        own = own_sampling(sampling)  # one rule everywhere (recurrent/sampling.py)
        turn = Turn(messages, max_tokens, prompt_ids, final=final, meta=meta, sampling=own)
        sampling = {**(self._final_sampling if final else self._sampling), **own}
        index = len(self.sites)
        self.sites.append(call_site())
        self.open.add(index)
        self.in_flight += 1
        try:
            if self._send_turn is not None:
                reply = await self._send_turn(turn, **sampling)
            else:  # prompt_ids only when built: an OpenAI-style client that does not know the keyword never sees it
                extra = {} if prompt_ids is None else {"prompt_ids": prompt_ids}
                reply = await self._client.chat(messages, max_tokens, **extra, **sampling)
            gate = REPLY_GATE.get()
            if gate is not None:
                await gate(self._task)
        finally:
            self.in_flight -= 1
            self.open.discard(index)
        if stop_requested():  # a cancellation that arrived together with the reply: stop here, not at the next call
            raise asyncio.CancelledError("cancelled between calls")
        if prompt_ids is None:
            turn.prompt_ids = reply.prompt_ids  # what a token backend rendered from the messages
        if self._keep_prompts:
            self._record(index, TurnRecord(turn, reply))
        else:
            facts = Turn([], max_tokens, final=final, meta=turn.meta, sampling=turn.sampling)
            kept = Reply(
                reply.text, reply.finish_reason, None, reply.prompt_tokens, reply.completion_tokens, reply.seconds
            )
            self._record(index, TurnRecord(facts, kept))
        if self._on_turn is not None:
            self._on_turn(turn, reply)
        return reply

    def _record(self, index: int, record: TurnRecord) -> None:
        """``record`` put in ``history`` at the place of the ``index``-th call made."""
        place = bisect.bisect(self._made, index)
        self._made.insert(place, index)
        self.history.insert(place, record)


class FunctionEpisode(Episode):
    """One sample's run of an agent function."""

    def __init__(
        self, agent: AgentFunction, sample: Any, config: WorkflowConfig, name: str, keep_prompts: bool = True
    ) -> None:
        self.agent = agent
        self.sample = sample  # what the function receives: the row, or what its workflow prepared from it
        self.config = config
        self.name = name
        self.keep_prompts = keep_prompts
        self.max_prompt_tokens: int | None = None  # training's rollout.prompt_length, set by the trainer (CallRecorder)
        self._recorder: CallRecorder | None = None
        self._answer: str | None = None
        self._score: float | None = None

    @property
    def history(self) -> list[TurnRecord]:
        return self._recorder.history if self._recorder is not None else []

    @property
    def finished(self) -> bool:
        return self._answer is not None

    @property
    def answer(self) -> str | None:
        return self._answer

    @property
    def score(self) -> float | None:
        return self._score

    async def run(
        self,
        client: ChatClient,
        sampling: dict[str, Any] | None = None,
        final_sampling: dict[str, Any] | None = None,
        on_turn: Callable[[Turn, Reply], None] | None = None,
    ) -> None:
        """Call the agent function with a recording client; ``final_sampling`` applies to calls flagged final."""
        if self._recorder is not None:
            raise RuntimeError(f"agent {self.name!r}: an episode runs once")
        recorder = self._recorder = CallRecorder(client, sampling, on_turn, final_sampling, self.keep_prompts)
        recorder.max_prompt_tokens = self.max_prompt_tokens
        answer = await self.agent(self.sample, recorder, self.config)
        score = None
        if isinstance(answer, Answer):
            answer, score = answer.text, answer.score
        if not isinstance(answer, str):
            raise TypeError(
                f"agent {self.name!r} returned a {type(answer).__name__}, expected its answer as a str (or an Answer)"
            )
        open_at_return, made = set(recorder.open), len(recorder.sites)
        await asyncio.sleep(0)  # one pass: calls it started just before returning begin, ones it cancelled end
        late = sorted(open_at_return | recorder.open | set(range(made, len(recorder.sites))))
        if late:
            raise CallLeftRunningError(
                f"agent {self.name!r} returned with {len(late)} model call(s) still running: every call is a row of "
                "its episode, so an agent awaits (or cancels) each call it starts before it returns, e.g. with "
                "asyncio.gather",
                [recorder.sites[i] for i in late],
            )
        if not recorder.history:
            raise RuntimeError(
                f"agent {self.name!r} returned without calling the model: an episode is its model calls (in training "
                "each one is a row, and the last one's reply is the answer), so an agent makes at least one"
            )
        self._answer, self._score = answer, score

    def trace(self) -> dict[str, Any]:
        scored = {} if self._score is None else {"score": self._score}
        return {**super().trace(), "answer": self._answer, **scored}


class FunctionWorkflow(Workflow):
    """An agent function with its config: one :class:`FunctionEpisode` per sample."""

    episode_class: type[FunctionEpisode] = FunctionEpisode

    def __init__(
        self,
        config: WorkflowConfig,
        tokenizer: Any,
        *,
        name: str,
        agent: AgentFunction,
        columns: tuple[str, ...] = (),
        row_widths: RowWidthsOf | None = None,
        keep_prompts: bool = True,
    ) -> None:
        super().__init__(config, tokenizer)
        self.name = name
        self.agent = agent
        self.columns = columns
        self._row_widths = row_widths
        self.keep_prompts = keep_prompts

    def prepare(self, sample: dict[str, Any]) -> Any:
        """What the agent function receives as its sample: by default the row itself, checked for the columns the
        agent reads. An agent that tokenizes a long document overrides it: episodes are built in a worker thread
        where a caller has an event loop (verl_ext/rollout.py), so the work stays off the loop."""
        missing = [column for column in self.columns if column not in sample]
        if missing:
            raise KeyError(f"agent {self.name!r}: the sample has no column {missing[0]!r}; columns: {sorted(sample)}")
        return sample

    def episode(self, sample: dict[str, Any]) -> FunctionEpisode:
        return self.episode_class(self.agent, self.prepare(sample), self.config, self.name, self.keep_prompts)

    def row_widths(self) -> RowWidths | None:
        if self._row_widths is None:
            return None
        if self.tokenizer is None:
            raise ValueError(f"agent {self.name!r}: its row widths are counted in tokens and need a tokenizer")
        return self._row_widths(self.config, self.tokenizer)


def agent_function(
    name: str,
    config_cls: type[WorkflowConfig],
    agent: AgentFunction,
    *,
    columns: Columns = (),
    large_columns: Columns = (),
    row_widths: RowWidthsOf | None = None,
    needs_tokenizer: bool = False,
) -> WorkflowRegistration:
    """The registration of an agent function (its module's ``REGISTER``). ``columns``: what a sample must hold;
    ``large_columns``: what is too large to copy into every training row (both a tuple, or a function of the
    config that returns one); ``row_widths(config, tokenizer)``: its widest call, checked against a trainer's rows
    before the first step (without it, each call is checked as it is made, and a call that does not fit fails its
    trajectory). ``needs_tokenizer``: whether the agent needs the model's tokenizer at inference (it counts tokens
    itself); by default not, since its calls are chat messages, so the endpoint serves it without one
    (``row_widths`` needs one, but only in training)."""

    def build(config: WorkflowConfig, tokenizer: Any) -> FunctionWorkflow:
        return FunctionWorkflow(
            config, tokenizer, name=name, agent=agent, columns=registration.columns_of(config), row_widths=row_widths
        )

    registration = WorkflowRegistration(
        name=name,
        config_cls=config_cls,
        build=build,
        columns=columns,
        large_columns=large_columns,
        needs_tokenizer=needs_tokenizer,
        source=agent,
    )
    return registration
