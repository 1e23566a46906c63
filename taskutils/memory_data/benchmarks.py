"""LongBench-QA and BABILong, from their published files into the harness's eval sets.

The published formats (checked against the publishers' repositories: docs/third_party_eval.md, "LongBench-QA and
BABILong"):

- LongBench (``THUDM/LongBench``, ``data.zip``): ``data/{subset}.jsonl``, one JSON object a line with ``input`` (the
  question), ``context`` (the long document), ``answers`` (a list of every gold answer), ``length`` (words),
  ``dataset`` (the subset's name), ``language``, ``all_classes`` (null for QA) and ``_id``.
- BABILong (``RMT-team/babilong``): ``data/qa{N}/{config}.json`` for the configs ``0k`` ... ``512k``, ``1M``, a JSON
  array of objects with ``input`` (the facts hidden in the background text: the document), ``question`` and
  ``target`` (the one answer). JSON lines are read too.

Written: ``eval_longbench_{subset}_0.jsonl`` and ``eval_babilong_qa{N}_{K}.jsonl`` (K the config's thousands, 1000 for
``1M``) with ``index`` (the record's position in its file), ``input`` (the question), ``context``, ``answers`` and
the record's own fields kept for tracing (LongBench ``_id``, ``length``; BABILong ``config``). Every record is
checked before anything is written; a bad one is a :class:`SourceError` naming the file, the line and the field.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from taskutils.memory_data.output import ResumableJsonl
from taskutils.memory_data.sources import SourceError
from taskutils.memory_data.stages import StageReport, file_sha256

LONGBENCH_SUBSETS = ("narrativeqa", "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "musique")
BABILONG_TASKS = ("qa1", "qa2", "qa3", "qa4", "qa5")
BABILONG_CONFIGS = ("0k", "1k", "2k", "4k", "8k", "16k", "32k", "64k", "128k", "256k", "512k", "1M")


def babilong_length(config: str) -> int:
    """The harness's length of a BABILong config: its thousands of tokens as named (``1M`` is 1000)."""
    if config not in BABILONG_CONFIGS:
        raise SourceError(f"unknown BABILong config {config!r}; published: {', '.join(BABILONG_CONFIGS)}")
    return 1000 if config == "1M" else int(config[:-1])


def longbench_source(sources: Path, subset: str) -> Path:
    return sources / "longbench" / f"{subset}.jsonl"


def babilong_source(sources: Path, task: str, config: str) -> Path:
    return sources / "babilong" / task / f"{config}.json"


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def read_records(path: Path) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` of every record of a JSON-lines file or a JSON array, ``where`` naming the file and
    the line the record starts on."""
    if not path.is_file():
        raise SourceError(f"{path}: file not found (run: python -m taskutils.memory_data download)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise SourceError(f"{path}: not valid UTF-8 at byte {err.start} ({err.reason})") from None
    decoder = json.JSONDecoder()
    start = len(text) - len(text.lstrip())
    if text[start : start + 1] == "[":  # a JSON array: each element decoded where it stands, to name its line
        pos = _skip(path, text, start + 1)
        while text[pos] != "]":
            try:
                record, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as err:
                raise SourceError(f"{path}:{err.lineno}:{err.colno}: not valid JSON ({err.msg})") from None
            yield f"{path}:{_line_of(text, pos)}", record
            pos = _skip(path, text, end)
            if text[pos] == ",":
                pos = _skip(path, text, pos + 1)
            elif text[pos] != "]":
                raise SourceError(f"{path}:{_line_of(text, pos)}: not valid JSON (expected ',' or ']' after an item)")
        return
    for line_no, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield f"{path}:{line_no}", json.loads(line)
            except json.JSONDecodeError as err:
                raise SourceError(f"{path}:{line_no}:{err.colno}: not valid JSON ({err.msg})") from None


def _skip(path: Path, text: str, pos: int) -> int:
    """The position of the next character that is not JSON white space; the end of the text is an error."""
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    if pos >= len(text):
        raise SourceError(f"{path}: not valid JSON: the array is not closed (is the download incomplete?)")
    return pos


def _text(where: str, record: dict, name: str, empty_ok: bool = False) -> str:
    value = record.get(name)
    if not isinstance(value, str) or (not empty_ok and not value.strip()):
        what = "is missing" if name not in record else f"must be a non-empty string, got {value!r:.80}"
        raise SourceError(f"{where}: field {name!r} {what}; fields: {', '.join(sorted(record))}")
    return value


def _object(where: str, record: Any) -> dict:
    if not isinstance(record, dict):
        raise SourceError(f"{where}: a record must be a JSON object, got {record!r:.80}")
    return record


def longbench_items(path: Path, subset: str) -> list[dict[str, Any]]:
    """The checked eval items of one LongBench QA file (see the module docstring)."""
    items = []
    for index, (where, raw) in enumerate(read_records(path)):
        record = _object(where, raw)
        question, context = _text(where, record, "input"), _text(where, record, "context")
        answers = record.get("answers")
        if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
            what = (
                "is missing" if "answers" not in record else f"must be a non-empty list of strings, got {answers!r:.80}"
            )
            raise SourceError(f"{where}: field 'answers' {what}")
        if record.get("dataset", subset) != subset:
            raise SourceError(
                f"{where}: field 'dataset' is {record['dataset']!r}, not {subset!r}: another subset's file?"
            )
        item = {"index": index, "input": question, "context": context, "answers": answers, "_id": record.get("_id")}
        items.append(item | {"length": record.get("length"), "dataset": subset})
    if not items:
        raise SourceError(f"{path}: no records")
    return items


def babilong_items(path: Path, config: str) -> list[dict[str, Any]]:
    """The checked eval items of one BABILong file: the record's ``input`` is the document, its ``question`` the
    question, its ``target`` the one gold answer."""
    items = []
    for index, (where, raw) in enumerate(read_records(path)):
        record = _object(where, raw)
        context = _text(where, record, "input", empty_ok=config == "0k")
        question, target = _text(where, record, "question"), _text(where, record, "target")
        items.append({"index": index, "input": question, "context": context, "answers": [target], "config": config})
    if not items:
        raise SourceError(f"{path}: no records")
    return items


def write_items(out: Path, name: str, items: list[dict[str, Any]], config: dict[str, Any]) -> StageReport:
    """Write checked items to ``out/name`` (resumable, registered in the folder's manifest)."""
    start = time.perf_counter()
    writer = ResumableJsonl(out, name, config, (), len(items))
    skipped = writer.done
    if not writer.done:
        with writer:
            for item in items[writer.start :]:
                writer.write(item)
    return StageReport(writer.final, len(items), skipped, time.perf_counter() - start)


def convert_longbench(out: Path, sources: Path, subset: str, limit: int | None = None) -> StageReport:
    """``eval_longbench_{subset}_0.jsonl`` from ``<sources>/longbench/{subset}.jsonl`` (the first ``limit``)."""
    source = longbench_source(sources, subset)
    items = longbench_items(source, subset)[:limit]
    config = {"stage": "longbench", "subset": subset, "source": file_sha256(source)}
    return write_items(out, f"eval_longbench_{subset}_0.jsonl", items, config)


def convert_babilong(out: Path, sources: Path, task: str, config: str, limit: int | None = None) -> StageReport:
    """``eval_babilong_{task}_{K}.jsonl`` from ``<sources>/babilong/{task}/{config}.json`` (the first ``limit``)."""
    length = babilong_length(config)
    source = babilong_source(sources, task, config)
    items = babilong_items(source, config)[:limit]
    settings = {"stage": "babilong", "task": task, "config": config, "source": file_sha256(source)}
    return write_items(out, f"eval_babilong_{task}_{length}.jsonl", items, settings)
