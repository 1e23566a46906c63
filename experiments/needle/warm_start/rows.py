"""The warm start's rows (docs/replication_cpu_notebook.md, "Warm start"): the agent it trains for, and the copy stages'
and the choosing task's rows, each a ``(prompt ids, target ids)`` pair on documents of the train split."""

from __future__ import annotations

import random
from typing import Any

from experiments.needle.needle import NEEDLE, NEEDLE_RE, make_choice_document, make_document
from experiments.sft import Row
from recurrent.impls.memory import Memory, MemoryConfig, MemoryWorkflow

CHUNK_SIZE = 64
MEMORY_TOKENS = 32
FINAL_TOKENS = 16
# The choosing task's warm start: its naive stage's documents hold 1 to this many other needles.
CHOOSE_DISTRACTORS = 3
# The answer stage's pool and held-out rows (a switch: :func:`answer_rows`).
ANSWER_ROWS = (3000, 200)


def agent_config(max_chunks: int | None = None) -> MemoryConfig:
    """The agent of the replication: 64-token chunks, 32-token memory, boxed final answer."""
    return MemoryConfig(
        chunk_size=CHUNK_SIZE,
        max_memorization_length=MEMORY_TOKENS,
        max_chunks=max_chunks,
        max_final_response_length=FINAL_TOKENS,
        max_prompt_length=64,
        final_prompt="boxed",
    )


def sample_of(doc: dict[str, Any]) -> dict[str, Any]:
    return {"context": doc["context"], "prompt": doc["question"]}


# ---------------------------------------------------------------------------------------------------------
# data of the four stages
# ---------------------------------------------------------------------------------------------------------


def needle_rows(tokenizer: Any, rng: random.Random, count: int) -> list[Row]:
    """Bare chunk + "\\nmemory:" -> " needle" + eos (1-chunk train documents)."""
    rows = []
    for _ in range(count):
        doc = make_document(rng, tokenizer, 1, "train")
        prompt = tokenizer.encode(doc["context"] + "\nmemory:", add_special_tokens=False)
        rows.append(
            (prompt, tokenizer.encode(" " + doc["needle"], add_special_tokens=False) + [tokenizer.eos_token_id])
        )
    return rows


def paper_rows(workflow: MemoryWorkflow, rng: random.Random, count: int) -> list[Row]:
    """The paper's memory prompt of a 1-chunk train document (empty memory) -> needle + eos."""
    tokenizer = workflow.tokenizer
    rows = []
    for _ in range(count):
        doc = make_document(rng, tokenizer, 1, "train")
        reading = workflow.prepare(sample_of(doc))
        prompt = reading.memory_prompt(reading.initial_memory, next(reading.chunks()))  # the first call's prompt
        rows.append((prompt.ids, tokenizer.encode(doc["needle"], add_special_tokens=False) + [tokenizer.eos_token_id]))
    return rows


def answer_rows(workflow: MemoryWorkflow, rng: random.Random, count: int) -> list[Row]:
    """The answer stage's rows: the final prompt of a train document of 1 to 4 chunks (in turn) whose memory is its
    needle sentence -> ``\\boxed{number}`` + eos. The read-out of a kept needle; without this stage the naive stage
    teaches it only from its final turns, and whether 146 steps form it is a build's draw
    (docs/replication_cpu_notebook.md, "The build on another machine")."""
    tokenizer = workflow.tokenizer
    rows = []
    for i in range(count):
        doc = make_document(rng, tokenizer, 1 + i % 4, "train")
        prompt = workflow.prepare(sample_of(doc)).final_prompt(Memory(doc["needle"])).ids
        target = tokenizer.encode(f"\\boxed{{{doc['value']}}}", add_special_tokens=False) + [tokenizer.eos_token_id]
        rows.append((prompt, target))
    return rows


def choice_rows(workflow: MemoryWorkflow, rng: random.Random, count: int, held: bool = False) -> list[Row]:
    """The paper's memory prompt of a 1-chunk choosing document (1 to :data:`CHOOSE_DISTRACTORS` other needles,
    empty memory) -> one of its needle sentences, drawn at random, + eos: once the key's first word is written, the
    rest of that needle, not a blend of several. ``held``: the target's first tokens up to the key's first word move
    into the prompt, so that a row's exact score is the copy that follows the choice."""
    tokenizer = workflow.tokenizer
    lead = len(tokenizer.encode(NEEDLE.split(" {key}")[0], add_special_tokens=False)) + 1  # up to the key's 1st word
    rows = []
    for i in range(count):
        doc = make_choice_document(rng, tokenizer, 1, "train", 1 + i % CHOOSE_DISTRACTORS)
        reading = workflow.prepare(sample_of(doc))
        prompt = reading.memory_prompt(reading.initial_memory, next(reading.chunks())).ids
        needle = rng.choice(NEEDLE_RE.findall(doc["context"]))
        target = tokenizer.encode(NEEDLE.format(key=needle[0], value=needle[1]), add_special_tokens=False)
        target += [tokenizer.eos_token_id]
        rows.append((prompt + target[:lead], target[lead:]) if held else (prompt, target))
    return rows


def recall_rows(
    tokenizer: Any,
    rng: random.Random,
    count: int,
    split: str = "train",
    target: str = "number",
    prompt: str = "bare",
    distractors: int = CHOOSE_DISTRACTORS,
) -> tuple[list[Row], list[int]]:
    """The recall stage's rows: ``count`` 1-chunk choosing documents of ``split`` (1 to ``distractors`` other
    needles in turn) whose target is the *asked* needle's number (``target`` sentence: its whole sentence), +
    eos; also each row's number of needles. ``prompt`` bare: the document, the question and ``"\\nanswer:"`` (the
    stage's rows: question answering, not a memory turn); paper: the memory agent's first prompt (what RL sees)."""
    workflow = MemoryWorkflow(agent_config(), tokenizer) if prompt == "paper" else None
    rows, needles = [], []
    for i in range(count):
        doc = make_choice_document(rng, tokenizer, 1, split, 1 + i % distractors)
        if workflow is None:
            ids = tokenizer.encode(f"{doc['context']}\n{doc['question']}\nanswer:", add_special_tokens=False)
            text = " " + (doc["value"] if target == "number" else doc["needle"])
        else:
            reading = workflow.prepare(sample_of(doc))
            ids = reading.memory_prompt(reading.initial_memory, next(reading.chunks())).ids
            text = doc["value"] if target == "number" else doc["needle"]
        rows.append((ids, tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]))
        needles.append(len(NEEDLE_RE.findall(doc["context"])))
    return rows, needles
