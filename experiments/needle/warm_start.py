"""The warm start of the CPU replication: plain-torch SFT of the ~1M-parameter reader, and its measurement.

    python -m experiments.needle.warm_start --cache [--quick] [--force] [--task choose [--recipe recall]]
    python -m experiments.needle.warm_start --out DIR [--steps 1030 200 75 146] [--p-needle 0.4] [--seed 0]
        [--stop-at 0.9] [--p-keep 0.9] [--copy-stages DIR] [--task choose]
    python -m experiments.needle.warm_start --evaluate DIR [--docs 32] [--chunks 1 2 4] [--sample] [--task choose]

Build (AdamW, loss on target tokens only, one CPU thread), four stages, each stopped at its target or its step
budget (:data:`FULL`: 1030 / 200 / 75 / 146 steps, those of the measured build; :data:`QUICK`: a few steps, for
tests of the pipeline). Step budgets, not time caps, so the weights do not depend on the machine's speed.

1. ``synth``: 64 random tokens holding ``{ x1..xk }`` and ending with ``{ x1..xk }`` again, k = 24-30, so half
   the row is supervised copy (lr 3e-3, 100 warm-up steps, batch 32; stop at per-token accuracy 0.9). A dense
   copy signal forms copying in ~250 steps; spans of 4-12 tokens stall (docs/replication_probes.md).
2. ``needle``: a 1-chunk train document + "\\nmemory:" -> " " + needle sentence (stop at 0.9 exact).
3. ``paper``: the paper's memory prompt of a 1-chunk train document, built by the memory agent
   (:class:`memagent.agent.MemoryWorkflow`) -> needle sentence (lr 1e-3, 20 warm-up; stop at 0.9 exact).
4. ``naive``: every turn of naive-teacher transcripts of train documents of 1-4 chunks (no target).

The naive teacher (:func:`teacher_transcript`) knows the format, not a good reading policy: on a chunk holding
the needle it writes the needle sentence with probability ``p_needle``, else the chunk's first complete
filler sentence; on a chunk without it, it keeps a needle already in memory with probability ``p_keep``, else
writes the chunk's first complete sentence. Final turn: ``\\boxed{number in memory}``, or a random 4-digit
guess. Its filler choice is positional (the first sentence), not random: a student of a teacher that writes the
needle with p = 0.5 and otherwise one of ~5 sentences at random decodes the needle greedily (the needle is the
mode), so greedy accuracy would far exceed the teacher's. Transcripts are episodes of the real memory agent
(``chunk_size`` 64, ``max_memorization_length`` 32) answered by the teacher, so the training prompts are the
evaluation prompts token for token.

The choosing task (``--task choose``; docs/replication_cpu.md, "The choosing task") has its own naive stage: its
documents hold the asked needle and 1-3 others (:func:`teacher_document`), and its teacher (:func:`choice_write`)
always writes one whole needle, the asked one with probability ``p_needle``, so that RL has only to learn which one
to keep. Its copy stages are the needle task's, kept in the cache beside it and reused (:func:`copy_stages_dir`).
Two recipes (``--recipe``, :data:`CHOOSE_RECIPES`): ``choice`` (the default; cache ``replication-reader-choose``)
adds a choice stage (copy a random needle of several, :func:`choice_rows`) and writes whole sentences; ``recall``
(``replication-reader-choose-recall``; "The choice taught with its answer") adds a recall stage instead (answer
the asked key's number from a short document, :func:`recall_rows`, stopped at exact 0.95) and writes numbers.

Saves a Hugging Face Qwen2 folder (model, tokenizer with chat template, generation config) with
``warm_start.json`` (recipe, stage logs with steps, stop reason, training and wall seconds).
:func:`cached_warm_start` keeps it in the offline model cache of :mod:`recurrent.models`
(``replication-reader``, ``replication-reader-quick``) with that module's manifest, written last.

Evaluation drives memory-agent episodes (:class:`~memagent.agent.MemoryWorkflow`) with
:func:`recurrent.lockstep.run_lockstep` and a Hugging Face ``generate`` callable over validation documents, and
scores the final answers with ``memagent.verifiers.strict``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from experiments.needle.needle import (
    NEEDLE,
    NEEDLE_RE,
    filler_sentence,
    make_choice_document,
    make_document,
    number_rule,
    split_numbers,
)
from experiments.needle.reader import CORPORA, build_tokenizer, reader_config
from experiments.sft import (
    Point,
    Row,
    add_cache_arguments,
    cached_build,
    new_reader,
    numerics,
    pin_numerics,
    save,
    scale_sizes,
    sft_steps,
    teacher_forced,
    torch_threads,
)
from experiments.small_reader import copy_rows as synth_rows
from memagent.agent import MemoryConfig, MemoryWorkflow
from memagent.verifiers.strict import strict_score
from recurrent.async_manager import run_session
from recurrent.atomic import atomic_path
from recurrent.interface import Reply, Turn
from recurrent.lockstep import run_lockstep
from recurrent.models import models_dir

CHUNK_SIZE = 64
MEMORY_TOKENS = 32
FINAL_TOKENS = 16
# The choosing task's warm start: its naive stage's documents hold 1 to this many other needles.
CHOOSE_DISTRACTORS = 3
TASKS = ("needle", "choose")
# What the choosing task's teacher writes of the needle it picks: its whole sentence (the default) or its number.
FORMS = ("number", "sentence")
NUMBER_RE = re.compile(r"\d{4}")


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
) -> tuple[list[Row], list[int]]:
    """The recall stage's rows: ``count`` 1-chunk choosing documents of ``split`` (1 to :data:`CHOOSE_DISTRACTORS`
    other needles in turn) whose target is the *asked* needle's number (``target`` sentence: its whole sentence), +
    eos; also each row's number of needles. ``prompt`` bare: the document, the question and ``"\\nanswer:"`` (the
    stage's rows: question answering, not a memory turn); paper: the memory agent's first prompt (what RL sees)."""
    workflow = MemoryWorkflow(agent_config(), tokenizer) if prompt == "paper" else None
    rows, needles = [], []
    for i in range(count):
        doc = make_choice_document(rng, tokenizer, 1, split, 1 + i % CHOOSE_DISTRACTORS)
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


def complete_sentences(chunk_text: str, context: str) -> list[str]:
    """The context's sentences that lie whole in a chunk's text, in order."""
    found = [(chunk_text.find(s), s) for s in re.split(r"(?<=\.) ", context) if s and s in chunk_text]
    return [s for _, s in sorted(found)]


def needle_write(
    doc: dict[str, Any], memory: str, sentences: list[str], rng: random.Random, p_needle: float, p_keep: float
) -> str:
    """The needle task's naive teacher on one chunk (its complete ``sentences``, the ``memory`` before it): the
    needle with probability ``p_needle`` on its chunk, else the chunk's first filler sentence; a needle in memory
    kept with probability ``p_keep``, else the chunk's first sentence."""
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
    (docs/replication_cpu.md, "The choosing task"), as its whole sentence (``form`` sentence, the default) or
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
    p_needle: float = 0.4,
    p_keep: float = 0.9,
    task: str = "needle",
    form: str = "sentence",
) -> list[tuple[str, Row, str]]:
    """The naive teacher's turns on one document, as (kind, (prompt ids, target ids), target text), built by
    running the real agent with the teacher as its model: each memory turn is the task's policy
    (:func:`needle_write`, :func:`choice_write`) on the chunk's complete sentences; the final turn boxes the
    number in memory, else a random number of the train split."""
    tokenizer = workflow.tokenizer
    episode = workflow.episode(sample_of(doc))
    numbers = split_numbers("train")
    write = partial(choice_write, form=form) if task == "choose" else TEACHERS[task]
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
    p_needle: float = 0.4,
    p_keep: float = 0.9,
    task: str = "needle",
    form: str = "sentence",
) -> list[Row]:
    """Every turn of the naive teacher's transcripts of ``count`` documents (:func:`teacher_document`), the rows of
    the naive stage."""
    rows = []
    for i in range(count):
        doc = teacher_document(rng, workflow.tokenizer, i, task)
        rows += [row for _, row, _ in teacher_transcript(workflow, doc, rng, p_needle, p_keep, task, form)]
    return rows


# ---------------------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------------------


def train_stage(
    model: Any,
    name: str,
    sample: Any,
    held: list[Row],
    pad_id: int,
    lr: float,
    warmup: int,
    steps: int,
    stop_key: str | None,
    stop_at: float = 0.9,
    batch: int = 32,
    eval_every: int = 25,
    log: Any = print,
) -> dict[str, Any]:
    """:func:`experiments.sft.sft_steps` on ``sample(batch)`` for at most ``steps`` steps. The held-out rows are
    scored every ``eval_every`` steps and after the last one; the stage stops at the first score whose ``stop_key``
    reaches ``stop_at`` (no target: ``stop_key`` None)."""
    curve: list[dict[str, Any]] = []
    stopped = "budget"

    def point(at: Point) -> bool:
        nonlocal stopped
        res = teacher_forced(model, held, pad_id)
        rec = {"stage": name, "step": at.step, "train_min": round(at.train_s / 60, 2), "tokens": at.tokens}
        rec |= {"train_loss": round(at.loss, 3), **res}
        curve.append(rec)
        log(
            f"{name:<6} step {at.step:>4}/{steps:<4} {rec['train_min']:6.2f} min  train loss {rec['train_loss']:.3f}"
            f"  held-out: tok_acc {res['tok_acc']:.3f} exact {res['exact']:.3f} loss {res['loss']:.3f}"
        )
        if stop_key is not None and res[stop_key] >= stop_at:
            stopped = "target"
        return stopped == "target"

    last = sft_steps(model, sample, pad_id, lr, warmup, steps, batch, eval_every, point)
    return {
        "stage": name,
        "budget": steps,
        "steps": curve[-1]["step"],
        "stopped": stopped,
        "train_s": round(last.train_s, 1),
        "tokens": last.tokens,
        "tok_per_s": round(last.tokens / max(last.train_s, 1e-9)),
        "lr": lr,
        "final": curve[-1],
        "curve": curve,
    }


@dataclass(frozen=True)
class Scale:
    """The size of a build: its name in the model cache, the step budget of each stage (synth, needle, paper,
    naive; a stage with a target may stop earlier), the training pools (needle rows, paper rows, naive-teacher
    transcripts), the held-out sets (synth, needle and paper rows, transcripts) and the batch size."""

    name: str
    steps: tuple[int, int, int, int]
    pools: tuple[int, int, int] = (3000, 3000, 2400)
    held: tuple[int, int, int, int] = (256, 200, 200, 60)
    batch: int = 32


@dataclass(frozen=True)
class ChooseScale(Scale):
    """The choosing task's build, with two stages between the copy stages and the naive one: ``recall``, the step
    budget of question answering over several needles (:func:`recall_rows`, stopped at exact ``recall_stop``;
    ``recall_held`` held-out rows) and ``choice``, that of copying one needle of several (:func:`choice_rows`;
    ``choice_rows``: its pool and held-out rows); 0: no such stage. ``form``: what the naive teacher writes of a
    needle (:data:`FORMS`)."""

    choice: int = 0
    choice_rows: tuple[int, int] = (3000, 200)
    recall: int = 0
    recall_held: int = 300
    recall_stop: float = 0.95
    form: str = "sentence"


# The warm start: the budgets are the steps of the measured build (docs/replication_cpu.md, "Warm start"), whose
# stages stopped at time caps (synth, naive) or at their targets (needle, paper).
FULL = Scale("replication-reader", steps=(1030, 200, 75, 146))
# The same four stages in seconds, for tests of the pipeline's artefacts (its accuracy is that of a random model).
QUICK = Scale("replication-reader-quick", steps=(8, 2, 2, 2), pools=(64, 64, 16), held=(32, 16, 16, 4))
# The choosing task's warm start (docs/replication_cpu.md, "The choosing task"): the same stages and budgets, a
# choice stage, its own naive stage (choosing documents, choice_write writing whole sentences), under its own names
# in the cache.
CHOOSE = ChooseScale(
    "replication-reader-choose", steps=(*FULL.steps[:3], 600), pools=(*FULL.pools[:2], 4800), choice=200
)
CHOOSE_QUICK = ChooseScale(
    "replication-reader-choose-quick",
    steps=QUICK.steps,
    pools=QUICK.pools,
    held=QUICK.held,
    choice=2,
    choice_rows=(64, 16),
)
# Its recall recipe (``--recipe recall``; docs/replication_cpu.md, "The choice taught with its answer"): a recall
# stage in place of the choice stage (the reader learns to answer the asked key's number from a short document; the
# choice formed after a plateau of ~3,000 steps in one run, and not within this budget in another), then a naive
# teacher that writes the number it picks.
CHOOSE_RECALL = replace(
    CHOOSE, name="replication-reader-choose-recall", steps=(*FULL.steps[:3], 300), choice=0, recall=8000, form="number"
)
CHOOSE_RECALL_QUICK = replace(
    CHOOSE_QUICK, name="replication-reader-choose-recall-quick", choice=0, recall=2, recall_held=16, form="number"
)
CHOOSE_RECIPES = {"choice": (CHOOSE, CHOOSE_QUICK), "recall": (CHOOSE_RECALL, CHOOSE_RECALL_QUICK)}
# Bump when the build changes (data, stages, optimizer), so a cached warm start built the old way is rebuilt.
# 2: the reader reads numbers as two-digit tokens; numbers dealt to splits at random. 3: the kernels' numerics pinned
# (experiments.sft.PINNED_NUMERICS), the manifest records the stages' stop steps and scores.
RECIPE_VERSION = 3
# The same for the choosing task's naive stage (its copy stages are the needle task's, RECIPE_VERSION).
CHOOSE_RECIPE_VERSION = 2  # 2: the recipe records its recall stage and memory form (recall recipe added)
COPY_STAGES = "copy_stages.json"  # in a copy_dir of train(): what the saved model's three stages were


def train(
    scale: Scale = FULL,
    p_needle: float = 0.4,
    p_keep: float = 0.9,
    seed: int = 0,
    threads: int = 1,
    log: Any = print,
    stop_at: float = 0.9,
    copy_dir: Path | None = None,
    task: str = "needle",
    corpus: str = "task",
) -> tuple[Any, Any, dict[str, Any]]:
    """Train the warm start; returns the model, its tokenizer and the recipe with the stage logs. ``stop_at``: the
    held-out score at which the three copy stages stop (a higher one copies more exactly, in more steps).
    ``copy_dir``: where the model after the three copy stages is kept (with their logs and the random streams'
    states), reused by a later build of the same copy stages (seed, ``stop_at``, their budgets, pools, batch), so
    that teacher variants train only the naive stage; the result is the build without it, weight for weight.
    ``task``: the naive stage's documents and teacher (needle: :func:`needle_write`; choose: choosing documents,
    :func:`teacher_document`, and :func:`choice_write`); the three copy stages are the same for both."""
    from transformers import AutoModelForCausalLM

    t_build = time.perf_counter()
    pin_numerics()  # before the first kernel of this build's process: the same weights on any x86-64 machine
    with torch_threads(threads):
        torch.manual_seed(seed)
        tokenizer = build_tokenizer(corpus=corpus)
        pad = tokenizer.pad_token_id
        model = new_reader(tokenizer, reader_config(tokenizer))
        workflow = MemoryWorkflow(agent_config(), tokenizer)
        rng, held_rng = random.Random(f"train-{seed}"), random.Random(f"held-{seed}")

        logs: list[dict[str, Any]] = []
        t_stage = time.perf_counter()

        extra = (
            {"recall": getattr(scale, "recall", 0), "choice": getattr(scale, "choice", 0)} if task == "choose" else {}
        )
        budgets = dict(zip(("synth", "needle", "paper", "naive"), scale.steps, strict=True)) | extra
        stages = 4 + sum(map(bool, extra.values()))

        def stage(name: str, sample: Any, held: list[Row], lr: float, warmup: int, stop_key: str | None, every=25):
            nonlocal t_stage
            budget, stop = budgets[name], scale.recall_stop if name == "recall" else stop_at
            target = f"stop at {stop_key} >= {stop}" if stop_key else "no target"
            log(f"stage {len(logs) + 1}/{stages} {name}: at most {budget} steps of batch {scale.batch}, {target}")
            kw = {"batch": scale.batch, "eval_every": every, "log": log}
            rec = train_stage(model, name, sample, held, pad, lr, warmup, budget, stop_key, stop, **kw)
            now = time.perf_counter()  # the stage's wall time includes making its data
            logs.append(rec | {"wall_s": round(now - t_stage, 1)})
            t_stage = now

        copy_key = {"version": RECIPE_VERSION, "seed": seed, "stop_at": stop_at, "steps": list(scale.steps[:3])}
        copy_key |= {"corpus": corpus, "numbers": number_rule()} if (corpus, number_rule()) != ("task", "dealt") else {}
        copy_key |= {"pools": list(scale.pools[:2]), "held": list(scale.held[:3]), "batch": scale.batch}
        saved = copy_dir / COPY_STAGES if copy_dir else None
        if saved and saved.is_file() and json.loads(saved.read_text())["key"] == copy_key:
            state = json.loads(saved.read_text())
            model.load_state_dict(AutoModelForCausalLM.from_pretrained(copy_dir).state_dict())
            logs += [stage_log | {"reused_from": str(copy_dir)} for stage_log in state["stages"]]
            for stream, (version, internal, gauss) in ((rng, state["rng"]), (held_rng, state["held_rng"])):
                stream.setstate((version, tuple(internal), gauss))
            log(f"stages 1-3: the copy stages of {copy_dir}, reused")
        else:
            synth_held = synth_rows(tokenizer, held_rng, scale.held[0])
            stage("synth", lambda n: synth_rows(tokenizer, rng, n), synth_held, 3e-3, 100, "tok_acc")
            needle_pool, needle_held = (
                needle_rows(tokenizer, rng, scale.pools[0]),
                needle_rows(tokenizer, held_rng, scale.held[1]),
            )
            stage("needle", lambda n: rng.sample(needle_pool, n), needle_held, 3e-3, 100, "exact")
            paper_pool, paper_held = (
                paper_rows(workflow, rng, scale.pools[1]),
                paper_rows(workflow, held_rng, scale.held[2]),
            )
            stage("paper", lambda n: rng.sample(paper_pool, n), paper_held, 1e-3, 20, "exact")
            if copy_dir:
                with atomic_path(copy_dir, folder=True) as tmp:
                    model.save_pretrained(tmp)
                    state = {"key": copy_key, "stages": logs, "rng": rng.getstate(), "held_rng": held_rng.getstate()}
                    (tmp / COPY_STAGES).write_text(json.dumps(state) + "\n")
        if budgets.get("recall"):
            recall_held = recall_rows(tokenizer, held_rng, scale.recall_held)[0]
            recall_sample = lambda n: recall_rows(tokenizer, rng, n)[0]  # noqa: E731  (fresh documents every step)
            stage("recall", recall_sample, recall_held, 1e-3, 50, "exact", every=250)
        if budgets.get("choice"):
            pool, held = scale.choice_rows
            choice_pool, choice_held = choice_rows(workflow, rng, pool), choice_rows(workflow, held_rng, held, True)
            stage("choice", lambda n: rng.sample(choice_pool, n), choice_held, 1e-3, 20, "exact")
        form = getattr(scale, "form", "sentence")
        teacher = partial(teacher_rows, workflow, p_needle=p_needle, p_keep=p_keep, task=task, form=form)
        naive_pool, naive_held = teacher(rng, scale.pools[2]), teacher(held_rng, scale.held[3])
        stage("naive", lambda n: rng.sample(naive_pool, n), naive_held, 1e-3, 20, None, every=50)
    recipe = {
        "reader": {"params": sum(p.numel() for p in model.parameters()), "vocab": len(tokenizer)},
        "task": task,
        "tokenizer_corpus": corpus,
        "numbers": number_rule(),
        "teacher": {"p_needle": p_needle, "p_keep": p_keep, "filler": "first complete sentence of the chunk"},
        "seed": seed,
        "stop_at": stop_at,
        "threads": threads,
        "numerics": numerics(),
        "scale": asdict(scale),
        "stages": logs,
        "build_wall_s": round(time.perf_counter() - t_build, 1),
    }
    return model, tokenizer, recipe


def build(out: Path, scale: Scale = FULL, p_needle: float = 0.4, p_keep: float = 0.9, seed: int = 0, **kw: Any) -> dict:
    """Build the warm start into the folder ``out`` (written in place: see :func:`cached_warm_start` for the
    cache); returns the recipe with the stage logs. ``kw``: ``threads``, ``log``, ``stop_at``, ``copy_dir``,
    ``task`` of :func:`train`."""
    model, tokenizer, recipe = train(scale, p_needle, p_keep, seed, **kw)
    save(out, model, tokenizer, recipe)
    return recipe


def manifest_extra(
    scale: Scale, seed: int = 0, p_needle: float = 0.4, p_keep: float = 0.9, task: str = "needle"
) -> dict[str, Any]:
    """What the cache manifest records besides name and recipe version: what changes the weights (the choosing
    task's: also its task, the copy stages' recipe version and the most distractors of its naive stage)."""
    extra = {"seed": seed, "p_needle": p_needle, "p_keep": p_keep, **scale_sizes(scale)}
    if task == "choose":
        extra |= {"task": task, "copy_recipe": RECIPE_VERSION, "distractors": CHOOSE_DISTRACTORS}
    return extra


def build_outcome(recipe: dict[str, Any]) -> dict[str, Any]:
    """How a build came out, for its manifest: each stage's stop step, why it stopped and its last held-out scores,
    and the numerics it ran with (two builds of one recipe that agree here agree weight for weight, as far as a
    record can tell)."""
    scores = ("tok_acc", "exact", "loss")
    stages = [
        {"stage": s["stage"], "steps": s["steps"], "stopped": s["stopped"], **{k: s["final"][k] for k in scores}}
        for s in recipe["stages"]
    ]
    return {"stages": stages, "numerics": recipe["numerics"]}


def copy_stages_dir(root: Path | None, scale: Scale) -> Path:
    """Where the choosing task's cached build keeps its three copy stages (:func:`train`'s ``copy_dir``): beside
    the builds, ``<root>/replication-reader-copy-stages`` (quick: ``replication-reader-quick-copy-stages``)."""
    base = scale.name.replace("-choose", "").replace("-recall", "")
    return (root or models_dir()) / f"{base}-copy-stages"


def cached_warm_start(
    root: Path | None = None,
    quick: bool = False,
    force: bool = False,
    scale: Scale | None = None,
    log: Any = print,
    task: str = "needle",
    recipe: str = "choice",
) -> Path:
    """The warm start in the model cache (``root``, default :func:`recurrent.models.models_dir`), built unless an
    up-to-date copy is there: ``<root>/replication-reader`` (``quick``: ``replication-reader-quick``; ``scale``:
    another size, ``scale.name``; ``task`` choose: ``replication-reader-choose``, ``-choose-quick``, its copy stages
    kept in :func:`copy_stages_dir` and reused). The build trains in memory, then writes the folder under a
    temporary name with the manifest last and renames it, so a killed build leaves no folder that looks complete."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; one of {TASKS}")
    choose = task == "choose"
    if recipe not in CHOOSE_RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; one of {tuple(CHOOSE_RECIPES)}")
    scale = scale or (CHOOSE_RECIPES[recipe][quick] if choose else (QUICK if quick else FULL))
    copy_dir = copy_stages_dir(root, scale) if choose else None
    t0 = time.perf_counter()

    def build_into(tmp: Path) -> dict[str, Any]:
        model, tokenizer, recipe = train(scale, log=log, copy_dir=copy_dir, task=task)
        save(tmp, model, tokenizer, recipe)
        log(f"{scale.name}: built in {(time.perf_counter() - t0) / 60:.1f} min")
        return build_outcome(recipe)

    between = [
        f"{name} {getattr(scale, name, 0)}" for name in ("recall", "choice") if choose and getattr(scale, name, 0)
    ]
    what = f"steps at most {'/'.join(map(str, scale.steps))}{''.join(', ' + b for b in between)}, one thread"
    version = CHOOSE_RECIPE_VERSION if choose else RECIPE_VERSION
    extra = manifest_extra(scale, task=task)
    return cached_build(root, scale.name, version, extra, build_into, force, what, log)


# ---------------------------------------------------------------------------------------------------------
# evaluation with the real agent
# ---------------------------------------------------------------------------------------------------------


class HFGenerate:
    """A ``generate(i, turn)`` callable for :func:`recurrent.lockstep.run_lockstep`: one Hugging Face
    ``generate`` call per turn on its token prompt, greedy or sampled (temperature 1)."""

    def __init__(self, model: Any, tokenizer: Any, sample: bool = False, seed: int = 0) -> None:
        self.model, self.tokenizer, self.sample = model, tokenizer, sample
        self.generator_seed = seed
        self.tokens = 0
        self.seconds = 0.0
        torch.manual_seed(seed)

    async def __call__(self, i: int, turn: Turn) -> Reply:
        t0 = time.perf_counter()
        ids = torch.tensor([turn.prompt_ids])
        kwargs = (
            {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if self.sample else {"do_sample": False}
        )
        with torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=turn.max_tokens,
                eos_token_id=self.tokenizer.eos_token_id,
                pad_token_id=self.tokenizer.pad_token_id,
                **kwargs,
            )
        new = out[0, ids.shape[1] :].tolist()
        stopped = self.tokenizer.eos_token_id in new
        if stopped:
            new = new[: new.index(self.tokenizer.eos_token_id) + 1]
        seconds = time.perf_counter() - t0
        self.tokens += len(turn.prompt_ids) + len(new)
        self.seconds += seconds
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        return Reply(text, "stop" if stopped else "length", new, len(turn.prompt_ids), len(new), seconds)


def whole_needles(sessions: list[Any], documents: list[dict[str, Any]]) -> dict[str, Any]:
    """Of the choosing task's memories that name a needle (every memory after every chunk that mentions a magic
    number or holds a 4-digit number), the share that is exactly one of the document's needles, as a sentence or as
    a bare number (not a blend of several), and the share that is the asked one."""
    mentions = whole = asked = 0
    for session, doc in zip(sessions, documents, strict=True):
        pairs = [NEEDLE_RE.fullmatch(doc["needle"]).groups(), *((d["key"], d["value"]) for d in doc["distractors"])]
        needles = {NEEDLE.format(key=k, value=v) for k, v in pairs} | {v for _, v in pairs}
        for memory in session.memory_trace:
            if "magic number" in memory or NUMBER_RE.search(memory):
                mentions += 1
                whole += memory.strip() in needles
                asked += memory.strip() in (doc["needle"], pairs[0][1])
    share = (lambda k: round(k / mentions, 3)) if mentions else (lambda k: 0.0)
    return {"needle_memories": mentions, "whole_needle": share(whole), "asked_needle": share(asked)}


def evaluate(
    folder: Path,
    docs: int = 32,
    chunks: tuple[int, ...] = (1, 2, 4),
    sample: bool = False,
    split: str = "validation",
    distractors: int = 0,
) -> dict[str, Any]:
    """Strict accuracy per length of the memory agent driven by the model in ``folder``, plus how often the
    final memory holds the needle sentence / the needle's number, and generation tokens/s. ``distractors``: the
    choosing task's documents with that many other needles (the needle: the asked one)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    workflow = MemoryWorkflow(agent_config(), tokenizer)
    results = {}
    for n in chunks:
        documents = [
            make_choice_document(random.Random(f"eval-{split}-{n}-{k}"), tokenizer, n, split, distractors)
            if distractors
            else make_document(random.Random(f"eval-{split}-{n}-{k}"), tokenizer, n, split)
            for k in range(docs)
        ]
        sessions = [workflow.episode(sample_of(d)) for d in documents]
        generate = HFGenerate(model, tokenizer, sample=sample, seed=n)
        t0 = time.perf_counter()
        run = asyncio.run(run_lockstep(sessions, generate))
        wall = time.perf_counter() - t0
        scores = [strict_score(s.answer or "", [d["value"]]) for s, d in zip(sessions, documents, strict=True)]
        final_memory = [(s.memory_trace[-1] if s.memory_trace else "") for s in sessions]
        # The memory written on the needle's own chunk: did the reader copy the needle when it saw it?
        written = [
            d["needle"] in s.memory_trace[d["needle_chunk"]]
            for s, d in zip(sessions, documents, strict=True)
            if len(s.memory_trace) > d["needle_chunk"]
        ]
        results[n] = {
            "docs": docs,
            "strict": round(sum(scores) / docs, 3),
            "needle_in_memory": round(
                sum(d["needle"] in m for d, m in zip(documents, final_memory, strict=True)) / docs, 3
            ),
            "number_in_memory": round(
                sum(d["value"] in m for d, m in zip(documents, final_memory, strict=True)) / docs, 3
            ),
            "needle_written": round(sum(written) / docs, 3),
            "boxed": round(sum("\\boxed{" in (s.answer or "") for s in sessions) / docs, 3),
            **(whole_needles(sessions, documents) if distractors else {}),
            "failed": run.num_failed,
            "wall_s": round(wall, 1),
            "tok_per_s": round(generate.tokens / generate.seconds),
            "example": {
                "memories": sessions[0].memory_trace,
                "answer": sessions[0].answer,
                "gold": documents[0]["value"],
            },
        }
    out = {"folder": str(folder), "split": split, "sample": sample, "lengths": results}
    return out | ({"distractors": distractors} if distractors else {})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.needle.warm_start", description=__doc__.split("\n\n")[0]
    )
    add_cache_arguments(parser, "the CI-sized build (seconds; an untrained reader)")
    parser.add_argument("--out", type=Path, help="build the warm start into this folder, then evaluate it")
    parser.add_argument("--evaluate", type=Path, help="evaluate the warm start in this folder")
    parser.add_argument("--steps", type=int, nargs=4, help="with --out: step budgets of the 4 stages")
    parser.add_argument(
        "--task",
        choices=TASKS,
        default="needle",
        help="the naive stage's documents and teacher, and the evaluation's documents (choose: "
        f"{CHOOSE_DISTRACTORS} other needles; the cache: replication-reader-choose)",
    )
    parser.add_argument(
        "--recipe",
        choices=tuple(CHOOSE_RECIPES),
        default="choice",
        help="the choosing task's recipe: choice (a choice stage, whole-sentence memories) or recall (a recall stage, "
        "number memories; the cache: replication-reader-choose-recall)",
    )
    parser.add_argument("--p-needle", type=float, default=0.4)
    parser.add_argument("--p-keep", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tokenizer-corpus",
        choices=CORPORA,
        default="task",
        help="with --out: the reader tokenizer's training text (keys: also the digit pairs and the keys, repeated)",
    )
    parser.add_argument(
        "--stop-at", type=float, default=0.9, help="with --out: the held-out score that stops the copy stages (0.9)"
    )
    parser.add_argument(
        "--copy-stages",
        type=Path,
        help="with --out: keep the model after the three copy stages in this folder, or reuse it when it holds them",
    )
    parser.add_argument("--docs", type=int, default=32, help="validation documents per length")
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--sample", action="store_true", help="sample (temperature 1) instead of greedy")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if sum(map(bool, (args.cache, args.out, args.evaluate))) != 1:
        parser.error("give one of --cache (build into the model cache), --out (build, evaluate), --evaluate")
    if args.recipe != "choice" and args.task != "choose":
        parser.error(f"--recipe {args.recipe} is a recipe of the choosing task: give --task choose")
    if args.cache and (
        args.copy_stages
        or args.steps
        or args.tokenizer_corpus != "task"
        or (args.p_needle, args.p_keep, args.seed, args.threads, args.stop_at) != (0.4, 0.9, 0, 1, 0.9)
    ):
        parser.error(
            "--cache builds the recipe as it is: --steps, --p-needle, --p-keep, --seed, --threads, --stop-at, "
            "--copy-stages, --tokenizer-corpus go with --out"
        )
    log = partial(print, flush=True)
    if args.cache:
        folder = cached_warm_start(args.root, args.quick, args.force, log=log, task=args.task, recipe=args.recipe)
        print(folder, flush=True)
        return
    torch.set_num_threads(args.threads)
    if args.out:
        scale = CHOOSE_RECIPES[args.recipe][args.quick] if args.task == "choose" else (QUICK if args.quick else FULL)
        if args.steps:
            scale = replace(scale, steps=tuple(args.steps))
        recipe = build(
            args.out,
            scale,
            args.p_needle,
            args.p_keep,
            args.seed,
            threads=args.threads,
            log=log,
            stop_at=args.stop_at,
            copy_dir=args.copy_stages,
            task=args.task,
            corpus=args.tokenizer_corpus,
        )
        print(json.dumps({k: v for k, v in recipe.items() if k != "stages"}))
    folder = args.evaluate or args.out
    distractors = CHOOSE_DISTRACTORS if args.task == "choose" else 0
    result = evaluate(folder, args.docs, tuple(args.chunks), args.sample, distractors=distractors)
    print(json.dumps(result, indent=1), flush=True)


if __name__ == "__main__":
    main()
