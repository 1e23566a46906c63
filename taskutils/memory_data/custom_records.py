"""The records of ``python -m taskutils.memory_data custom`` (taskutils/memory_data/custom.py), checked one by one:
each becomes an :class:`Example` or a list of its problems (``field 'x': problem`` each), and a record that repeats an
earlier one is found (:func:`find_repeats`)."""

from __future__ import annotations

import ast
import hashlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from taskutils.memory_data.custom_inputs import CustomDataError, Source, Unreadable, iter_raw
from taskutils.memory_data.hotpotqa import render_context
from taskutils.memory_data.sources import hotpotqa_doc
from taskutils.memory_eval.evalsets import lone_surrogate


@dataclass(frozen=True)
class Fields:
    """Where a record keeps its parts: ``context`` (one text) or ``documents`` (a list), exactly one set."""

    question: str = "question"
    answers: str = "answers"
    context: str | None = "context"
    documents: str | None = None
    id: str = "id"  # optional in a record: the eval item's index when given

    def __post_init__(self) -> None:
        if (self.context is None) == (self.documents is None):
            raise CustomDataError("give exactly one of a context field and a documents field")


@dataclass(frozen=True)
class Example:
    index: int  # position in the input, from 0
    question: str
    answers: list[str]
    context: str
    num_docs: int | None  # None: the context was one text
    id: int | str | None = None  # the record's id, when it has one

    @property
    def item_index(self) -> int | str:
        """The eval item's index: the id, else the position."""
        return self.index if self.id is None else self.id


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_ABSENT = object()


def _lookup(record: dict, name: str) -> Any:
    """``record[name]``, or for a dotted name the value under each part in turn; ``_ABSENT`` if missing."""
    if name in record:
        return record[name]
    value: Any = record
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return _ABSENT
        value = value[part]
    return value


def _missing(name: str, record: dict) -> str:
    return f"field {name!r}: missing; the record has {', '.join(sorted(map(str, record))) or 'no fields'}"


def _text(name: str, value: Any) -> str | None:
    """Problem with a field that must be non-empty text, or None."""
    if not isinstance(value, str):
        return f"field {name!r}: must be text, got {type(value).__name__} {_shown(value)}"
    if not value.strip():
        return f"field {name!r}: empty"
    return _surrogate(name, value)


def _surrogate(name: str, value: str) -> str | None:
    """Problem with text that holds a lone surrogate (``"\\ud800"`` in JSON: half of a pair), which no file
    can store as UTF-8: refused here, not by the writer once the records passed their checks."""
    at = lone_surrogate(value)
    if at is None:
        return None
    return (
        f"field {name!r}: a lone surrogate, {value[at]!r} at character {at}: not a character, UTF-8 cannot "
        "hold it (a \\ud800-\\udfff escape is half of a pair; write the whole character)"
    )


def _list_text(value: str) -> list[str] | None:
    """The list ``value`` is the text of (a Python or JSON list literal of strings and whole numbers, a number
    read as its digits: ``"[1984]"`` is ``["1984"]``), or None."""
    text = value.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return None
    try:
        parsed = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        try:
            parsed = json.loads(text)
        except ValueError:
            return None
    if not isinstance(parsed, list) or not all(_answer_like(v) for v in parsed):
        return None
    return [v if isinstance(v, str) else str(v) for v in parsed]


def _answer_like(value: Any) -> bool:
    """An item of a list-shaped answers string: text, or a whole number (its text is its digits)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _answers(name: str, value: Any, answer_lists: str = "error") -> tuple[list[str], list[str]]:
    if isinstance(value, str):
        listed = _list_text(value) if answer_lists != "literal" else None
        if listed is not None and answer_lists == "error":
            return [], [
                f"field {name!r}: the text of a list, {_shown(value)}, not one answer: --answer-lists parse reads it "
                "as that list, --answer-lists literal keeps it as one answer"
            ]
        value = listed if listed is not None else [value]
    elif not isinstance(value, list):
        got = f"{type(value).__name__} {_shown(value)}"
        return [], [f"field {name!r}: must be a string or a list of strings, got {got}"]
    if not value:
        return [], [f"field {name!r}: an empty list (at least one answer is needed)"]
    problems = [p for k, v in enumerate(value) if (p := _text(f"{name}[{k}]", v))]
    return value, problems


def _documents(name: str, value: Any) -> tuple[list[str], list[str]]:
    if not isinstance(value, list):
        return [], [f"field {name!r}: must be a list of documents, got {type(value).__name__} {_shown(value)}"]
    if not value:
        return [], [f"field {name!r}: an empty list"]
    docs, problems = [], []
    for k, doc in enumerate(value):
        where = f"{name}[{k}]"
        if not isinstance(doc, dict):
            problem = _text(where, doc)
        elif "text" not in doc:
            problem = f"field {where!r}: an object without 'text'; it has {', '.join(sorted(map(str, doc)))}"
        elif (title := doc.get("title")) is not None and not isinstance(title, str):
            problem = f"field {where + '.title'!r}: must be text, got {type(title).__name__} {_shown(title)}"
        elif title is not None and (problem := _surrogate(f"{where}.title", title)):
            pass
        else:
            problem = _text(f"{where}.text", doc["text"])
        if problem:
            problems.append(problem)
        elif isinstance(doc, dict):
            docs.append(hotpotqa_doc(doc["title"], [doc["text"]]) if doc.get("title") else doc["text"])
        else:
            docs.append(doc)
    return docs, problems


def _id(name: str, value: Any) -> tuple[int | str | None, list[str]]:
    if value is _ABSENT or value is None:
        return None, []
    if isinstance(value, int) and not isinstance(value, bool):
        return value, []
    if isinstance(value, str) and value.strip():
        problem = _surrogate(name, value)
        return (None, [problem]) if problem else (value, [])
    got = f"{type(value).__name__} {_shown(value)}"
    return None, [f"field {name!r}: must be an integer or a non-empty string, got {got}"]


def to_example(
    record: Any, fields: Fields, index: int, answer_lists: str = "error"
) -> tuple[Example | None, list[str]]:
    """The record as an :class:`Example`, or None and its problems (``field 'x': problem`` each)."""
    if isinstance(record, Unreadable):
        return None, [str(record)]
    if not isinstance(record, dict):
        return None, [f"a record must be an object, got {type(record).__name__} {_shown(record)}"]
    problems: list[str] = []
    question, answers, context, num_docs = "", [], "", None
    for name in (fields.question, fields.answers, fields.context or fields.documents):  # problems in this order
        value = _lookup(record, name)
        if value is _ABSENT or value is None:
            problems.append(_missing(name, record) if value is _ABSENT else f"field {name!r}: null")
            continue
        if name == fields.question:
            question, more = value, [p for p in [_text(name, value)] if p]
        elif name == fields.answers:
            answers, more = _answers(name, value, answer_lists)
        elif name == fields.documents:
            docs, more = _documents(name, value)
            context, num_docs = render_context(list(range(len(docs))), docs), len(docs)
        else:
            context, more = value, [p for p in [_text(name, value)] if p]
        problems += more
    record_id, more = _id(fields.id, _lookup(record, fields.id))
    problems += more
    if problems:
        return None, problems
    return Example(index, question, list(answers), context, num_docs, record_id), []


def ignored_fields(record: Any, fields: Fields) -> list[str]:
    """The top-level fields of ``record`` that no option names (they are not written)."""
    if not isinstance(record, dict):
        return []
    named = [fields.question, fields.answers, fields.context or fields.documents, fields.id]
    used = {name if name in record else name.split(".")[0] for name in named}
    return [str(key) for key in record if key not in used]


def iter_examples(
    sources: list[Source], fields: Fields, answer_lists: str = "error", ignored: Counter | None = None
) -> Iterator[tuple[str, Example | None, list[str]]]:
    """``(where, example, problems)`` for every record of every source, indexed across the sources; ``ignored``
    counts the records that have each field no option names."""
    index = 0
    for source in sources:
        for where, record in iter_raw(source):
            example, problems = to_example(record, fields, index, answer_lists)
            if ignored is not None:
                ignored.update(ignored_fields(record, fields))
            yield where, example, problems
            index += 1


def find_repeats(
    example: Example, where: str, fields: Fields, seen: dict[bytes, str], indices: dict[int | str, tuple[str, bool]]
) -> list[str]:
    """Why ``example`` repeats an earlier record: its question and context, or its eval index (its id, or its
    position when it has none: the harness keys results by it); records what it is."""
    found = []
    # Records that differ only by white space at the ends of their question or context ask the same question of
    # the same text: one is a duplicate of the other.
    same = [example.question.strip(), example.context.strip()]
    digest = hashlib.sha256(json.dumps(same).encode("utf-8", "surrogatepass")).digest()
    if digest in seen:
        found.append(f"the same question and context as {seen[digest]} (a duplicate)")
    else:
        seen[digest] = where
    index = example.item_index
    if index in indices:
        earlier, earlier_is_id = indices[index]
        mine = f"its position {index} (no {fields.id!r})"
        if example.id is not None:
            mine = f"field {fields.id!r}: {index!r}"
        theirs = "the id" if earlier_is_id else "the position"
        found.append(f"{mine} is also {theirs} of {earlier}, the index of its eval item")
    else:
        indices[index] = (where, example.id is not None)
    return found
