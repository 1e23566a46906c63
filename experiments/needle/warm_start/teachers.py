"""The naive teachers of the warm start's last stage (docs/replication_cpu_notebook.md, "Warm start"; the choosing
task's: "The choosing task"): what they write on each chunk, their transcripts as episodes of the real memory agent, and
the stage's rows."""

from __future__ import annotations

import asyncio
import random
import re
from functools import partial
from typing import Any

from experiments.needle.needle import (
    NEEDLE_RE,
    NUMBER_RE,
    filler_sentence,
    make_choice_document,
    make_document,
    split_numbers,
)
from experiments.needle.warm_start.rows import CHOOSE_DISTRACTORS, CHUNK_SIZE, sample_of
from experiments.sft import Row
from recurrent.async_manager import run_session
from recurrent.impls.memory import MemoryWorkflow
from recurrent.interface import Reply, Turn

# What the choosing task's teacher writes of the needle it picks: its whole sentence (the default) or its number.
FORMS = ("number", "sentence")
# What the needle task's teacher writes when it does not write the needle: the chunk's first complete filler sentence,
# or the memory as it was (nothing new: an empty memory stays "No previous memory", a needle in memory is kept);
# docs/replication_cpu_notebook.md, "The cause, measured".
MISSES = ("first", "memory")
# The naive teacher's share of needle memories, by task: on the needle's chunk the needle task's teacher writes the
# needle with this probability; the choosing task's writes the asked needle (else another). 0.25, not 0.4, keeps the
# needle task's greedy warm start under 50% at 1-4 chunks with the keys corpus, and RL still lifts it to the bar
# (docs/replication_cpu_notebook.md, "The teacher's share of needles"; recipe 5).
P_NEEDLE = {"needle": 0.25, "choose": 0.4}


def share_of_needles(task: str, p_needle: float | None = None) -> float:
    """``p_needle`` as given, else the task's :data:`P_NEEDLE`."""
    return P_NEEDLE[task] if p_needle is None else p_needle


def complete_sentences(chunk_text: str, context: str) -> list[str]:
    """The context's sentences that lie whole in a chunk's text, in order."""
    found = [(chunk_text.find(s), s) for s in re.split(r"(?<=\.) ", context) if s and s in chunk_text]
    return [s for _, s in sorted(found)]


def needle_write(
    doc: dict[str, Any],
    memory: str,
    sentences: list[str],
    rng: random.Random,
    p_needle: float,
    p_keep: float,
    miss: str = "first",
) -> str:
    """The needle task's naive teacher on one chunk (its complete ``sentences``, the ``memory`` before it): the
    needle with probability ``p_needle`` on its chunk, else the chunk's first filler sentence; a needle in memory
    kept with probability ``p_keep``, else the chunk's first sentence. ``miss`` memory: where it does not write the
    needle it writes the memory as it was (``p_keep`` unused: a needle in memory is always kept)."""
    if miss not in MISSES:
        raise ValueError(f"unknown miss {miss!r}; one of {MISSES}")
    if miss == "memory":
        return doc["needle"] if doc["needle"] in sentences and rng.random() < p_needle else memory
    fillers = [s for s in sentences if s != doc["needle"]] or [filler_sentence(rng)]
    if doc["needle"] in sentences:
        return doc["needle"] if rng.random() < p_needle else fillers[0]
    if doc["needle"] == memory and rng.random() < p_keep:
        return memory
    return fillers[0]


def choice_write(
    doc: dict[str, Any],
    memory: str,
    sentences: list[str],
    rng: random.Random,
    p_needle: float,
    p_keep: float,
    form: str = "sentence",
) -> str:
    """The choosing task's naive teacher on one chunk: it writes one needle, not yet the right one
    (docs/replication_cpu_notebook.md, "The choosing task"), as its whole sentence (``form`` sentence, the default) or
    its number (``form`` number, the recall recipe). On the asked needle's chunk: the asked needle with probability
    ``p_needle``, else another needle shown so far (the chunk's first other needle, else the needle in memory,
    else the chunk's first filler sentence). On a chunk with other needles only: the asked needle in memory kept
    with probability ``p_keep``, else the chunk's first needle. On a chunk without needles: a needle in memory kept
    with probability ``p_keep``, else the chunk's first filler sentence."""
    if form not in FORMS:
        raise ValueError(f"unknown memory form {form!r}; one of {FORMS}")
    as_written = (lambda s: NEEDLE_RE.fullmatch(s).group(2)) if form == "number" else (lambda s: s)
    needles = [as_written(s) for s in sentences if NEEDLE_RE.fullmatch(s)]
    fillers = [s for s in sentences if not NEEDLE_RE.fullmatch(s)] or [filler_sentence(rng)]
    held = memory if (NUMBER_RE.fullmatch(memory) if form == "number" else NEEDLE_RE.fullmatch(memory)) else None
    asked = as_written(doc["needle"])
    if asked in needles:
        if rng.random() < p_needle:
            return asked
        others = [s for s in needles if s != asked] + ([held] if held else [])
        return others[0] if others else fillers[0]
    if needles:
        return held if held == asked and rng.random() < p_keep else needles[0]
    return held if held and rng.random() < p_keep else fillers[0]


TEACHERS = {"needle": needle_write, "choose": choice_write}


def teacher_transcript(
    workflow: MemoryWorkflow,
    doc: dict[str, Any],
    rng: random.Random,
    p_needle: float | None = None,
    p_keep: float = 0.9,
    task: str = "needle",
    form: str = "sentence",
    miss: str = "first",
) -> list[tuple[str, Row, str]]:
    """The naive teacher's turns on one document, as (kind, (prompt ids, target ids), target text), built by
    running the real agent with the teacher as its model: each memory turn is the task's policy
    (:func:`needle_write`, :func:`choice_write`) on the chunk's complete sentences; the final turn boxes the
    number in memory, else a random number of the train split. ``p_needle``: the task's :data:`P_NEEDLE` unless
    given."""
    p_needle = share_of_needles(task, p_needle)
    tokenizer = workflow.tokenizer
    episode = workflow.episode(sample_of(doc))
    numbers = split_numbers("train")
    write = partial(choice_write, form=form) if task == "choose" else partial(needle_write, miss=miss)
    out = []

    class Teacher:  # answers each call as its whole Turn, to see whether it is the answer and which chunk it reads
        async def send_turn(self, turn: Turn, **_: Any) -> Reply:
            memory = episode.reading.memory_text or ""
            if turn.final:
                match = NUMBER_RE.search(memory)  # a needle sentence or a bare number; filler has no digits
                text = f"\\boxed{{{match.group(0) if match else rng.choice(numbers)}}}"
            else:
                chunk = tokenizer.decode(episode.context_ids[turn.meta["chunk"] * CHUNK_SIZE :][:CHUNK_SIZE])
                text = write(doc, memory, complete_sentences(chunk, doc["context"]), rng, p_needle, p_keep)
            ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
            out.append(("final" if turn.final else "memory", (list(turn.prompt_ids), ids), text))
            return Reply(text, "stop", ids)

    asyncio.run(run_session(episode, Teacher()))
    return out


def teacher_document(rng: random.Random, tokenizer: Any, index: int, task: str = "needle") -> dict[str, Any]:
    """The ``index``-th document of the naive stage: 1-4 chunks in turn; for the choosing task 1 to
    :data:`CHOOSE_DISTRACTORS` other needles in turn (a curriculum mixed in, not ordered)."""
    if task == "choose":
        distractors = 1 + index % CHOOSE_DISTRACTORS
        return make_choice_document(rng, tokenizer, 1 + index % 4, "train", distractors)
    return make_document(rng, tokenizer, 1 + index % 4, "train")


def teacher_rows(
    workflow: MemoryWorkflow,
    rng: random.Random,
    count: int,
    p_needle: float | None = None,
    p_keep: float = 0.9,
    task: str = "needle",
    form: str = "sentence",
    miss: str = "first",
) -> list[Row]:
    """Every turn of the naive teacher's transcripts of ``count`` documents (:func:`teacher_document`), the rows of
    the naive stage."""
    rows = []
    for i in range(count):
        doc = teacher_document(rng, workflow.tokenizer, i, task)
        rows += [row for _, row, _ in teacher_transcript(workflow, doc, rng, p_needle, p_keep, task, form, miss)]
    return rows
