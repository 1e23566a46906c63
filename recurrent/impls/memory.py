"""The MemAgent memory agent: the one definition used by training, evaluation, serving and the quickstart.

A sample is a question and a long context. The context is tokenized once, centre-truncated to
``max_chunks * chunk_size`` tokens, and split into chunks of ``chunk_size`` tokens. The agent is one async function
over the chat client, :func:`read_and_answer`: for each chunk one fresh conversation sees the question, the current
memory and the chunk, and its reply *overwrites* the memory (capped at ``max_memorization_length`` new tokens); a
final conversation sees only the question and the memory, and answers in ``\\boxed{}`` (or, for the paper's
evaluation protocol, "Therefore, the answer is ..."). The memory starts as "No previous memory" (or, with
``MemoryConfig.memory_key``, as a row's own initial memory: a departure for training, off by default).

Every call carries its prompt both as chat messages (for OpenAI-compatible endpoints) and, with
``token_prompts=True``, as token ids built in token space (chunks are sliced from the context ids, never
decoded and re-encoded; the memory is the generated ids themselves when the backend returns them). The answer's
call is flagged final, so sync mode (recurrent/generation_manager.py) holds every answer for the batch's last round.

Read top to bottom, this file runs in order: the prompts and budgets, the loop, each call's prompt and the memory
it leaves, a row made a reading, the builds for inference and training. Beside it, what is not the agent's own
reading order: its episode as its users read it and the contexts its episodes share (recurrent/impls/memory_episode.py),
and the sizes of its calls (recurrent/impls/memory_cost.py).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from recurrent.functions import CallRecorder, FunctionWorkflow
from recurrent.impls import memory_cost
from recurrent.impls.memory_episode import ContextCache, MemoryEpisode
from recurrent.interface import Reply, RowWidths, WorkflowConfig, WorkflowRegistration, question_text
from recurrent.step_shapes import StepShapes, StepShapesRequest
from recurrent.templating import chat_token_template, render
from recurrent.tokens import centre_truncate, end_token_ids, num_chunks

logger = logging.getLogger(__name__)

# ---- The two prompts of the original MemAgent code: the interface the released checkpoints were trained on. ----
# Note the trailing space after "<problem>" and the final newline.
MEMORY_TEMPLATE = """You are presented with a problem, a section of an article that may contain the answer to the problem, and a previous memory. Please read the provided section carefully and update the memory with the new information that helps to answer the problem. Be sure to retain all relevant details from the previous memory while adding any new, useful information.

<problem> 
{prompt}
</problem>

<memory>
{memory}
</memory>

<section>
{chunk}
</section>

Updated memory:
"""  # noqa: E501, W291

FINAL_TEMPLATE_BOXED = """You are presented with a problem and a previous memory. Please answer the problem based on the previous memory and put the answer in \\boxed{}.

<problem> 
{prompt}
</problem>

<memory>
{memory}
</memory>

Your answer:
"""  # noqa: E501, W291

# What the released 7B/14B checkpoints saw in training. Their runs used the fork's sync path, whose token
# templates never un-double the braces written in the source, so the instruction literally reads "\boxed{{}}"
# (the async, evaluation and quickstart paths format the string and show "\boxed{}"). docs/fidelity.md.
FINAL_TEMPLATE_BOXED_RELEASED = FINAL_TEMPLATE_BOXED.replace("\\boxed{}", "\\boxed{{}}")

# The paper's evaluation prompt: the same prompt, the answer phrased "Therefore, the answer is" (no box).
FINAL_TEMPLATE_ANSWER_IS = FINAL_TEMPLATE_BOXED.replace(
    "put the answer in \\boxed{}.",
    'format your response as follows "Therefore, the answer is (insert answer here)".',
)

NO_MEMORY = "No previous memory"
THINK_END = "</think>"
FINAL_TEMPLATES = {
    "boxed": FINAL_TEMPLATE_BOXED,
    "boxed_released": FINAL_TEMPLATE_BOXED_RELEASED,
    "answer_is": FINAL_TEMPLATE_ANSWER_IS,
}


@dataclass
class MemoryConfig(WorkflowConfig):
    """Budgets of the memory agent; the defaults are the paper's (5000-token chunks, 1024-token memory)."""

    context_key: str = "context"  # column holding the long document
    question_key: str = "prompt"  # column holding the question: a string or a chat list [{"role","content"}]
    max_prompt_length: int = 1024  # budget for the question tokens
    chunk_size: int = 5000  # context tokens per memory turn
    max_memorization_length: int = 1024  # max new tokens of a memory update (the memory cap)
    max_chunks: int | None = 8  # contexts are centre-truncated to max_chunks * chunk_size; None: no limit
    max_final_response_length: int = 1024  # max new tokens of the final answer
    # boxed: "\boxed{}" (inference); boxed_released: "\boxed{{}}", what the released checkpoints were trained
    # on (the training default, configs/recurrent_trainer.yaml); answer_is: the paper's evaluation prompt.
    final_prompt: Literal["boxed", "boxed_released", "answer_is"] = "boxed"
    question_overflow: Literal["error", "truncate"] = "error"  # a question over budget: raise, or keep its head
    strip_context: bool = False  # the paper's evaluation strips the context before tokenizing
    strip_think: bool = False  # the paper's evaluation keeps only the text after "</think>" as memory
    # A column holding the memory an episode starts from (empty or None: the paper's "No previous memory"). The paper
    # always starts empty; None (the default) reads no column. docs/replication_cpu_notebook.md, "Episodes that start
    # late".
    memory_key: str | None = None

    def __post_init__(self) -> None:
        for name in ("max_prompt_length", "chunk_size", "max_memorization_length", "max_final_response_length"):
            if getattr(self, name) <= 0:
                raise ValueError(f"MemoryConfig.{name} must be positive, got {getattr(self, name)}")
        if self.max_chunks is not None and self.max_chunks <= 0:
            raise ValueError(f"MemoryConfig.max_chunks must be positive or None, got {self.max_chunks}")
        if self.final_prompt not in FINAL_TEMPLATES:
            raise ValueError(f"MemoryConfig.final_prompt must be one of {sorted(FINAL_TEMPLATES)}")
        if self.question_overflow not in ("error", "truncate"):
            raise ValueError("MemoryConfig.question_overflow must be 'error' or 'truncate'")

    @property
    def max_context_tokens(self) -> int | None:
        return None if self.max_chunks is None else self.max_chunks * self.chunk_size


@dataclass(frozen=True)
class Memory:
    """The memory as text and, when prompts are built in token space, as ids (None: encoded from the text)."""

    text: str
    ids: list[int] | None = None


@dataclass(frozen=True)
class Prompt:
    """One call's prompt: chat messages, and the same prompt in token space when built (else None)."""

    messages: list[dict[str, str]]
    ids: list[int] | None


async def read_and_answer(doc: Reading, client: CallRecorder, config: MemoryConfig) -> str:
    """The memory agent: the paper's loop over the chunks of one document, then the answer."""
    memory = doc.initial_memory
    for index, chunk in enumerate(doc.chunks()):
        prompt = doc.memory_prompt(memory, chunk)  # question + memory + chunk
        meta = {"chunk": index, "chunk_tokens": len(chunk)}
        reply = await client.chat(
            prompt.messages, config.max_memorization_length, prompt_ids=prompt.ids, kind="memory", meta=meta
        )
        memory = doc.remember(reply)  # the reply overwrites the memory
    prompt = doc.final_prompt(memory)  # question + memory
    reply = await client.chat(prompt.messages, config.max_final_response_length, prompt_ids=prompt.ids, final=True)
    return reply.text


class Reading:
    """One sample as the memory agent reads it: the question, the (centre-truncated) context ids, the prompts of
    its calls, and the memory after every chunk (``memory_trace``)."""

    def __init__(
        self,
        agent: MemoryWorkflow,
        question: str,
        question_ids: list[int],
        context_ids: np.ndarray,
        original_context_tokens: int | None = None,
        memory: str | None = None,
    ) -> None:
        self.agent = agent
        self.config: MemoryConfig = agent.config
        self.question = question
        self.question_ids = question_ids
        self.context_ids = context_ids
        self.original_context_tokens = len(context_ids) if original_context_tokens is None else original_context_tokens
        self.num_chunks = num_chunks(len(context_ids), self.config.chunk_size)
        self.initial_memory = Memory(memory) if memory else None  # None: "No previous memory"
        self.memory_trace: list[str] = []  # the memory after every chunk

    def chunks(self) -> Iterator[np.ndarray]:
        """The context ids, ``chunk_size`` at a time, each read when its turn comes (a context on disk stays there).
        A copy, not a view: a failed call's traceback keeps the agent's frame, and with it the chunk, alive, and a
        view would keep a document mapped from disk open (the endpoint's spooled documents, docs/serving.md)."""
        size = self.config.chunk_size
        for index in range(self.num_chunks):
            yield np.array(self.context_ids[index * size : (index + 1) * size])

    def remember(self, reply: Reply) -> Memory:
        """The reply overwrites the memory: :meth:`memory_of` it, kept in ``memory_trace``."""
        memory = self.memory_of(reply)
        self.memory_trace.append(memory.text)
        return memory

    def memory_of(self, reply: Reply) -> Memory:
        """The memory a reply makes: its text and, unless the memory is re-encoded, its generated ids without the
        end tokens (what the paper's sync training fed back); a reasoning model's conclusion with ``strip_think``."""
        if self.config.strip_think and THINK_END in reply.text:
            return Memory(reply.text.rsplit(THINK_END, 1)[1].strip())
        if reply.token_ids is not None and not self.agent.reencode_memory:
            return Memory(reply.text, [t for t in reply.token_ids if t not in self.agent.end_ids])
        return Memory(reply.text)

    @property
    def memory_text(self) -> str | None:
        """The memory now (None before any: "No previous memory")."""
        if self.memory_trace:
            return self.memory_trace[-1]
        return self.initial_memory.text if self.initial_memory else None

    def _memory(self, memory: Memory | None) -> tuple[str, list[int] | None]:
        """The memory as text and (token mode) ids; an empty or absent memory reads "No previous memory"."""
        if memory is None or (not memory.text and not memory.ids):
            return NO_MEMORY, self.agent.no_memory_ids
        ids = memory.ids
        if ids is None and self.agent.token_prompts:
            ids = self.agent.tokenizer.encode(memory.text, add_special_tokens=False)
        return memory.text, ids

    def memory_prompt(self, memory: Memory | None, chunk_ids: np.ndarray) -> Prompt:
        text, ids = self._memory(memory)
        chunk = self.agent.tokenizer.decode(chunk_ids, skip_special_tokens=True)
        content = render(MEMORY_TEMPLATE, prompt=self.question, memory=text, chunk=chunk)
        prompt_ids = None
        if self.agent.token_prompts:
            prompt_ids = self.agent.memory_ids_template.format(prompt=self.question_ids, memory=ids, chunk=chunk_ids)
        return Prompt([{"role": "user", "content": content}], prompt_ids)

    def final_prompt(self, memory: Memory | None) -> Prompt:
        text, ids = self._memory(memory)
        content = render(self.agent.final_template, prompt=self.question, memory=text)
        prompt_ids = None
        if self.agent.token_prompts:
            prompt_ids = self.agent.final_ids_template.format(prompt=self.question_ids, memory=ids)
        return Prompt([{"role": "user", "content": content}], prompt_ids)


class MemoryWorkflow(FunctionWorkflow):
    """The memory agent built for a config and tokenizer: :func:`read_and_answer` on one :class:`Reading` per
    sample. Templates are built once per tokenizer."""

    episode_class = MemoryEpisode

    def __init__(
        self,
        config: MemoryConfig,
        tokenizer: Any,
        token_prompts: bool = True,
        keep_prompts: bool = True,
        reencode_memory: bool = False,
    ) -> None:
        """``token_prompts``: build each call's prompt in token space (token-in backends, training).
        ``keep_prompts``: keep every call's prompt in the episode's history (training rows need them); without
        it an episode holds only the current chunk and the memory, so a pass over a document of any length
        needs memory for its token ids and nothing more (inference).
        ``reencode_memory``: in token space, put the memory into the next prompt as ``encode(text)`` (what an
        OpenAI-style endpoint sees) instead of the generated ids themselves (which the paper's sync training put
        there)."""
        columns = (config.question_key, config.context_key)
        super().__init__(
            config, tokenizer, name="memory", agent=read_and_answer, columns=columns, keep_prompts=keep_prompts
        )
        self.token_prompts = token_prompts
        self.reencode_memory = reencode_memory
        self.final_template = FINAL_TEMPLATES[config.final_prompt]
        self.memory_ids_template = chat_token_template(tokenizer, MEMORY_TEMPLATE) if token_prompts else None
        self.final_ids_template = chat_token_template(tokenizer, self.final_template) if token_prompts else None
        self.no_memory_ids = tokenizer.encode(NO_MEMORY, add_special_tokens=False)
        self.end_ids = end_token_ids(tokenizer)  # the memory is the generated ids without these
        # Training gives the n rollouts of a prompt one `uid`: its context is tokenized for the first of them only.
        self.contexts = ContextCache(tokenizer)

    def context_text(self, sample: dict[str, Any]) -> str:
        """The context of a row as a string (a missing value reads as an empty document)."""
        config: MemoryConfig = self.config
        if config.context_key not in sample:
            raise KeyError(f"sample has no column {config.context_key!r} (the context); columns: {sorted(sample)}")
        context = sample[config.context_key]
        if context is None:
            context = ""
        if not isinstance(context, str):
            raise TypeError(f"column {config.context_key!r} must hold a string, got {type(context).__name__}")
        return context.strip() if config.strip_context else context

    def prepare(self, sample: dict[str, Any]) -> Reading:
        """The reading of one row: its context tokenized (once for all rows of a ``uid``: training), truncated."""
        context = self.context_text(sample)
        question = question_text(sample, self.config.question_key)
        context_ids = self.contexts.ids(context, sample.get("uid"))
        return self.reading(question, context_ids, self.initial_memory(sample))

    def episode_from_ids(self, question: str, context_ids: np.ndarray, memory: str | None = None) -> MemoryEpisode:
        """The episode of an already tokenized context (the endpoint tokenizes a document on disk itself),
        starting from ``memory`` (None: "No previous memory")."""
        return self.episode_class(
            self.agent, self.reading(question, context_ids, memory), self.config, self.name, self.keep_prompts
        )

    def initial_memory(self, sample: dict[str, Any]) -> str | None:
        """The memory a row's episode starts from: its ``memory_key`` column (None without one, or when empty)."""
        key = self.config.memory_key
        if key is None:
            return None
        if key not in sample:
            raise KeyError(f"sample has no column {key!r} (the initial memory); columns: {sorted(sample)}")
        value = sample[key]
        if value is not None and not isinstance(value, str):
            raise TypeError(f"column {key!r} (the initial memory) must hold a string, got {type(value).__name__}")
        return value or None

    def row_widths(self) -> RowWidths:
        """The longest prompt and largest ``max_tokens`` of any call, when prompts are built in token space
        (:func:`recurrent.impls.memory_cost.row_widths`)."""
        if not self.token_prompts:
            raise ValueError("row_widths needs token_prompts=True (the template lengths are in tokens)")
        return memory_cost.row_widths(self.config, memory_cost.template_lengths(self))

    def reading(self, question: str, context_ids: np.ndarray, memory: str | None = None) -> Reading:
        """The reading of a question over tokenized context ids, starting from ``memory`` (None: "No previous
        memory"): the question checked against its budget, the context centre-truncated."""
        config: MemoryConfig = self.config
        question_ids = self.tokenizer.encode(question, add_special_tokens=False)
        if len(question_ids) > config.max_prompt_length:
            if config.question_overflow == "error":
                raise ValueError(
                    f"question has {len(question_ids)} tokens, over max_prompt_length={config.max_prompt_length} "
                    "(set question_overflow='truncate' to keep its first max_prompt_length tokens)"
                )
            logger.warning("question truncated from %d to %d tokens", len(question_ids), config.max_prompt_length)
            question_ids = question_ids[: config.max_prompt_length]
            question = self.tokenizer.decode(question_ids, skip_special_tokens=True)
        if memory is not None and self.token_prompts:
            memory_tokens = len(self.tokenizer.encode(memory, add_special_tokens=False))
            if memory_tokens > config.max_memorization_length:
                raise ValueError(
                    f"the initial memory has {memory_tokens} tokens, over max_memorization_length="
                    f"{config.max_memorization_length} (a call holding it could exceed the rollout's widths): "
                    f"{memory!r:.80}"
                )
        original = len(context_ids)
        context_ids = centre_truncate(np.asarray(context_ids), config.max_context_tokens)
        if len(context_ids) < original:
            logger.info("context centre-truncated from %d to %d tokens", original, len(context_ids))
        return Reading(self, question, question_ids, context_ids, original_context_tokens=original, memory=memory)


UNCAPPED_QUESTION = 10**9  # the paper's evaluation never caps the question (training's budget is 1024 tokens)


def inference_workflow(
    tokenizer: Any,
    chunk_size: int = 5000,
    max_new: int = 1024,
    final_max_new: int = 1024,
    max_context: int | None = None,
    final_prompt: Literal["boxed", "boxed_released", "answer_is"] = "answer_is",
    **config: Any,
) -> MemoryWorkflow:
    """The memory agent at inference, as the paper's evaluation runs it behind an OpenAI-style endpoint (the
    evaluation harness, the quickstart and the server all build it here): text in, text out; the question kept
    whole (a sample is ``{"input": question, "context": document}``); the context stripped and, with
    ``max_context``, centre-truncated to that many tokens in whole chunks (at least one); a reasoning model's
    memory is its text after "</think>"; one chunk held at a time, not every prompt. The defaults are the
    paper's budgets (5000-token chunks, 1024-token memory and answer) and its "the answer is" prompt. ``config``:
    :class:`MemoryConfig` fields set over these (the endpoint's ``--agent-config``; docs/serving.md)."""
    settings = MemoryConfig(
        context_key="context",
        question_key="input",
        max_prompt_length=UNCAPPED_QUESTION,
        chunk_size=chunk_size,
        max_memorization_length=max_new,
        max_final_response_length=final_max_new,
        max_chunks=None if max_context is None else max(1, max_context // chunk_size),
        final_prompt=final_prompt,
        strip_context=True,
        strip_think=True,
    )
    if config:
        settings = dataclasses.replace(settings, **config)
    return MemoryWorkflow(settings, tokenizer, token_prompts=False, keep_prompts=False)


def training_workflow(config: MemoryConfig, tokenizer: Any) -> MemoryWorkflow:
    """The memory agent as training runs it: prompts in token space, the memory the generated ids themselves."""
    return MemoryWorkflow(config, tokenizer, token_prompts=True)


def step_shapes(config: MemoryConfig, tokenizer: Any, request: StepShapesRequest) -> StepShapes:
    """The calls of a training step's trajectories, for the step cost model (recurrent/impls/memory_cost.py)."""
    workflow = None if tokenizer is None else MemoryWorkflow(config, tokenizer)
    return memory_cost.step_shapes(config, workflow, request)


REGISTER = WorkflowRegistration(
    name="memory",
    config_cls=MemoryConfig,
    build=training_workflow,
    inference=inference_workflow,
    columns=lambda config: (config.question_key, config.context_key),
    large_columns=lambda config: (config.context_key,),  # the document: tokenized once, never copied into rows
    calls_per_sample=memory_cost.calls_for_document,
    step_shapes=step_shapes,
    source=read_and_answer,
)
