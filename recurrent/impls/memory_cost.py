"""The sizes of the memory agent's calls: its widest call (the rows' widths a trainer checks, ``row_widths``), the
calls of one sample (its registration's ``calls_per_sample``), and the calls of a training step, for the step cost
model (its registration's ``step_shapes``; docs/cluster.md, "What a step costs").

A module of the memory agent (recurrent/impls/memory.py), which hands it the agent's config and workflow: this module
imports nothing of the agent. Every document's length goes through the agent's own chunking and budgets:
a memory update per chunk, then the answer. The documents are the training parquet's rows of the step, read
through the agent's own tokenization and centre truncation, or else the paper's 28K-token documents, assumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recurrent.interface import RowWidths
from recurrent.step_shapes import CallShape, StepShapes, StepShapesRequest
from recurrent.tokens import num_chunks

# The paper's training documents: 200 HotpotQA paragraphs per question, about 28K Qwen tokens (docs/fidelity.md,
# "Data"); a sum of 200 paragraphs varies by a few percent, so a step plan takes every document at this length.
PAPER_CONTEXT_TOKENS = 28_000
ASSUMED_QUESTION_TOKENS = 24  # a HotpotQA question in Qwen2.5's tokenizer, about 18 words
# The fixed prompt tokens in Qwen2.5's chat format (its default system turn), counted with the SmolLM2 tokenizer
# (the only English BPE here) inside that chat wrapper: used when the model's tokenizer is absent.
ESTIMATED_QWEN_TEMPLATE_TOKENS = (134, 89, 3)  # memory turn, final turn, "No previous memory"


@dataclass(frozen=True)
class TemplateLengths:
    """The fixed prompt tokens (chat template included) of a memory turn and of the final turn, and the empty
    memory's."""

    memory: int
    final: int
    no_memory: int
    source: str


@dataclass(frozen=True)
class Generated:
    """Tokens generated per memory update and per final answer (responses, end token included)."""

    memory: int
    answer: int
    source: str


def row_widths(config: Any, templates: TemplateLengths) -> RowWidths:
    """The longest prompt and largest ``max_tokens`` of any call, its prompts built in token space.

    A memory call holds the template, the question (<= max_prompt_length), a chunk (<= chunk_size) and
    the memory (the previous response, <= max_memorization_length tokens); the final call holds the
    template, the question and the memory."""
    memory = max(config.max_memorization_length, templates.no_memory)
    memory_turn = templates.memory + config.max_prompt_length + config.chunk_size + memory
    final_turn = templates.final + config.max_prompt_length + memory
    return RowWidths(
        prompt=max(memory_turn, final_turn),
        response=max(config.max_memorization_length, config.max_final_response_length),
        made_of=(
            f"chat template + instruction {templates.memory}, question max_prompt_length="
            f"{config.max_prompt_length}, chunk chunk_size={config.chunk_size}, memory max_memorization_length="
            f"{config.max_memorization_length}, answer max_final_response_length={config.max_final_response_length}"
        ),
    )


def calls_for_document(config: Any, context_tokens: int = PAPER_CONTEXT_TOKENS, **_: Any) -> int:
    """Model calls of one sample: a memory update per chunk of the (centre-truncated) document, then the answer.
    The default length is the paper's training documents (200 HotpotQA paragraphs, ~28K tokens)."""
    kept = context_tokens if config.max_context_tokens is None else min(context_tokens, config.max_context_tokens)
    return num_chunks(kept, config.chunk_size) + 1


def memory_agent_turns(
    context_tokens: int, question_tokens: int, config: Any, templates: TemplateLengths, generated: Generated
) -> list[CallShape]:
    """The calls of one trajectory: a memory update per chunk, then the final answer.

    ``config``: the agent's budgets (``chunk_size``, ``max_chunks``). A memory turn's prompt is the template, the
    question, its chunk and the memory (the previous response, or "No previous memory" first); the final turn's
    is the template, the question and the memory. The context is centre-truncated to ``max_chunks x chunk_size``
    first. The memory carried on counts the response's tokens (one more than the memory when the response ended
    with the end token)."""
    chunk = int(config.chunk_size)
    kept = context_tokens if config.max_chunks is None else min(context_tokens, int(config.max_chunks) * chunk)
    chunks = [min(chunk, kept - start) for start in range(0, kept, chunk)]
    turns = []
    for index, size in enumerate(chunks):
        memory = templates.no_memory if index == 0 else generated.memory
        turns.append(CallShape(templates.memory + question_tokens + size + memory, generated.memory))
    memory = generated.memory if chunks else templates.no_memory
    turns.append(CallShape(templates.final + question_tokens + memory, generated.answer))
    return turns


def template_lengths(workflow: Any | None, source: str = "its tokenizer") -> TemplateLengths:
    """The templates' lengths counted by the agent's ``workflow`` (its own token templates), else estimated."""
    if workflow is None:
        return TemplateLengths(
            *ESTIMATED_QWEN_TEMPLATE_TOKENS, "estimated for Qwen2.5's chat format: no tokenizer here"
        )
    return TemplateLengths(
        workflow.memory_ids_template.length,
        workflow.final_ids_template.length,
        len(workflow.no_memory_ids),
        f"counted with {source}",
    )


def generated_lengths(config: Any, request: StepShapesRequest) -> Generated:
    """The request's generated lengths, the caps where not given; each between 1 and its cap."""
    caps = (config.max_memorization_length, config.max_final_response_length)
    memory = request.call_tokens if request.call_tokens is not None else caps[0]
    answer = request.answer_tokens if request.answer_tokens is not None else caps[1]
    for name, value, cap, setting in (
        ("--call-tokens", memory, caps[0], "max_memorization_length"),
        ("--answer-tokens", answer, caps[1], "max_final_response_length"),
    ):
        if not 1 <= value <= cap:
            raise ValueError(f"{name} {value}: between 1 and the cap, {setting}={cap}")
    given = request.call_tokens is not None or request.answer_tokens is not None
    return Generated(memory, answer, "given" if given else "the caps, an upper bound")


def read_documents(path: Path, workflow: Any, first: int, count: int) -> tuple[list[int], list[int]]:
    """Each of the step's rows' context and question lengths, through the agent's own tokenization and centre
    truncation (``MemoryWorkflow.prepare``)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    if table.num_rows < first + count:
        raise ValueError(f"{path}: {table.num_rows} rows, the step needs rows {first + 1} to {first + count}")
    contexts, questions = [], []
    for index, sample in enumerate(table.slice(first, count).to_pylist(), start=first):
        try:
            reading = workflow.prepare(sample)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}, row {index}: {err}") from err
        contexts.append(len(reading.context_ids))
        questions.append(len(reading.question_ids))
    return contexts, questions


def step_shapes(config: Any, workflow: Any | None, request: StepShapesRequest) -> StepShapes:
    """The calls of each of the step's trajectories, and where the documents, the generated lengths and the
    templates' lengths came from. ``config``: the agent's settings; ``workflow``: the agent built with the model's
    tokenizer (None without one: the templates are then estimated)."""
    generated = generated_lengths(config, request)  # cheap checks before the data is read
    if request.data is not None:
        if workflow is None:
            raise ValueError(f"--data {request.data} needs the model's tokenizer: give --tokenizer FOLDER")
        contexts, questions = read_documents(request.data, workflow, request.first, request.prompts)
        documents = f"{request.data}, rows {request.first + 1}-{request.first + request.prompts}"
    else:
        context = PAPER_CONTEXT_TOKENS if request.context_tokens is None else request.context_tokens
        asked = ASSUMED_QUESTION_TOKENS if request.question_tokens is None else request.question_tokens
        question = min(asked, config.max_prompt_length)
        contexts, questions = [context] * request.prompts, [question] * request.prompts
        documents = (
            f"assumed: no parquet, every document {context:,} tokens"
            + (" (the paper's)" if context == PAPER_CONTEXT_TOKENS else "")
            + f", questions {question} tokens (--data FILE reads them)"
        )
    templates = template_lengths(workflow, request.tokenizer_source)
    trajectories = [
        memory_agent_turns(c, q, config, templates, generated) for c, q in zip(contexts, questions, strict=True)
    ]
    return StepShapes(
        trajectories,
        [
            ("documents", documents),
            ("generated", f"memory {generated.memory}, answer {generated.answer} tokens a turn ({generated.source})"),
            ("templates", f"memory turn {templates.memory}, final turn {templates.final} tokens ({templates.source})"),
        ],
    )
