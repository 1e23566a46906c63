"""RULER out-of-distribution sets: the 13 tasks at any target length, each sample calibrated with a tokenizer.

Task definitions follow NVIDIA RULER's ``synthetic.yaml``/``constants.py`` as MemAgent uses them:
question-only templates (the context is a separate field), lengths counted as input + context + tokens to
generate. Unlike the original, ``cwe``, ``qa_2`` and ``qa_1`` at 512K are generated too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from taskutils.memory_data.ruler.common import RulerSample
from taskutils.memory_data.ruler.cwe_fwe import CommonWordsTask, FrequentWordsTask
from taskutils.memory_data.ruler.niah import NiahParams, NiahTask
from taskutils.memory_data.ruler.qa import QATask
from taskutils.memory_data.ruler.vt import VariableTrackingTask

NIAH_TASKS = {
    "niah_single_1": NiahParams("repeat", "words", "numbers"),
    "niah_single_2": NiahParams("essay", "words", "numbers"),
    "niah_single_3": NiahParams("essay", "words", "uuids"),
    "niah_multikey_1": NiahParams("essay", "words", "numbers", num_keys=4),
    "niah_multikey_2": NiahParams("needle", "words", "numbers"),
    "niah_multikey_3": NiahParams("needle", "uuids", "uuids"),
    "niah_multivalue": NiahParams("essay", "words", "numbers", num_values=4),
    "niah_multiquery": NiahParams("essay", "words", "numbers", num_queries=4),
}
TASKS = (*NIAH_TASKS, "vt", "cwe", "fwe", "qa_1", "qa_2")
PAPER_LENGTHS = (8192, 16384, 32768, 65536, 131072, 262144, 524288)
# Bump when a change alters generated samples, so old folders are not mixed with new.
# 2: cwe as RULER defines it (wonderwords and english-words words, one-shot example, no multiplied frequencies).
GENERATOR_VERSION = 2


@dataclass(frozen=True)
class Sources:
    """Paths of the source files the tasks need (only the needed ones are read)."""

    essay: Path | None = None
    squad: Path | None = None
    hotpotqa_dev: Path | None = None


def source_kind(task: str) -> str | None:
    """Which source file a task reads: ``essay``, ``squad``, ``hotpotqa_dev`` or None."""
    if task in NIAH_TASKS:
        return "essay" if NIAH_TASKS[task].haystack == "essay" else None
    return {"qa_1": "squad", "qa_2": "hotpotqa_dev"}.get(task)


def make_task(task: str, length: int, seed: int, tokenizer, sources: Sources):
    """The generator object of ``task`` at ``length`` tokens; it has ``generate(index) -> (sample, tokens)``."""
    from taskutils.memory_data.sources import SourceError, read_essay, read_hotpotqa, read_squad

    kind = source_kind(task)
    path = getattr(sources, kind) if kind else None
    if kind and path is None:
        raise SourceError(f"task {task} needs the {kind} source file (--{kind.replace('_', '-')}-file)")
    if task in NIAH_TASKS:
        essay = read_essay(path) if kind == "essay" else None
        return NiahTask(task, length, seed, tokenizer, NIAH_TASKS[task], essay=essay)
    if task == "vt":
        return VariableTrackingTask(task, length, seed, tokenizer)
    if task == "cwe":
        return CommonWordsTask(task, length, seed, tokenizer)
    if task == "fwe":
        return FrequentWordsTask(task, length, seed, tokenizer)
    if task in ("qa_1", "qa_2"):
        source = read_squad(path) if task == "qa_1" else read_hotpotqa(path)
        return QATask(task, length, seed, tokenizer, source)
    raise ValueError(f"unknown RULER task {task!r}; known: {', '.join(TASKS)}")


def to_record(index: int, sample: RulerSample, tokens: int) -> dict:
    """One line of ``eval_{task}_{length}.jsonl``."""
    return {
        "index": index,
        "input": sample.input,
        "context": sample.context,
        "outputs": sample.outputs,
        "length": tokens,
        "answer_prefix": sample.answer_prefix,
        **sample.extra,
    }


__all__ = ["NIAH_TASKS", "PAPER_LENGTHS", "TASKS", "RulerSample", "Sources", "make_task", "source_kind", "to_record"]
