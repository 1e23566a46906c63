"""Eval-set files: where they are, how they are read, and what a valid item is.

Two file forms are read: JSON lines (what ``taskutils.memory_data`` writes) and a JSON array (how the paper's
HotpotQA sets were released, ``eval_{N}.json``). An item has ``input`` (the question), ``context`` and its gold
strings in ``answers`` (HotpotQA) or ``outputs`` (RULER); ``index`` names it (its position if absent).

``context`` is either the text or, as in the released sets above 10,000 documents, a list of document indices
into the pool of ``hotpotqa_dev.json``: the sorted set of every ``title + "\\n" + "".join(sentences)`` of every
question's context (the pool ``taskutils.memory_data`` builds too). Such a context is rendered
``"Document {i}:\\n{doc}"`` for i = 1, 2, ... in the listed order and joined by blank lines, one item at a time
when it is about to run (a 25,600-document context is ~3.5M tokens).

Every item of a selected file is checked before any model call; a bad one raises :class:`EvalDataError` naming
the file, the line (JSON lines) or the item position (JSON array), the field and its value.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from taskutils.memory_data.hotpotqa import render_context
from taskutils.memory_data.sources import SourceError, read_hotpotqa

HOTPOTQA = "hotpotqa"
POOL_FILE = "hotpotqa_dev.json"
GOLD_FIELDS = ("answers", "outputs")


class EvalDataError(ValueError):
    """An eval-set file that cannot be evaluated as it is (missing, empty, malformed, or a bad item)."""


def data_file(data_dir: str | Path, task: str, length: int) -> Path | None:
    """The eval set of (task, length): ``eval_{N}.jsonl`` (HotpotQA, N documents) or ``eval_{task}_{L}.jsonl``
    (RULER), or the released ``.json`` of the same name. None when neither exists; a folder (or anything else
    that is not a file) of either name raises :class:`EvalDataError`, naming it, rather than pass for a missing set."""
    stem = f"eval_{length}" if task == HOTPOTQA else f"eval_{task}_{length}"
    for suffix in (".jsonl", ".json"):
        path = Path(data_dir) / (stem + suffix)
        if path.is_file():
            return path
        if path.exists():
            what = "a folder" if path.is_dir() else "not a regular file"
            raise EvalDataError(f"{path}: {what}, not a file (the eval set of {task} at length {length})")
    return None


def expected_names(task: str, length: int) -> str:
    stem = f"eval_{length}" if task == HOTPOTQA else f"eval_{task}_{length}"
    return f"{stem}.jsonl or {stem}.json"


def pool_file(data_dir: str | Path, explicit: str | Path | None = None) -> Path | None:
    """The ``hotpotqa_dev.json`` that index contexts point into: the given file, else ``<data_dir>/`` or
    ``<data_dir>/sources/`` (where ``python -m taskutils.memory_data download`` puts it)."""
    if explicit is not None:
        return Path(explicit)
    for candidate in (Path(data_dir) / POOL_FILE, Path(data_dir) / "sources" / POOL_FILE):
        if candidate.is_file():
            return candidate
    return None


@functools.lru_cache(maxsize=2)
def document_pool(path: Path) -> tuple[str, ...]:
    """The sorted document pool of a HotpotQA dev file (read once per run)."""
    try:
        return tuple(read_hotpotqa(path).docs)
    except SourceError as err:
        raise EvalDataError(str(err)) from err


TOO_DEEP = "not valid JSON (it nests too deep to read: an item nests a few levels)"


def _shown(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _raw_items(path: Path) -> Iterator[tuple[str, Any]]:
    """``(where, raw)`` per item: the raw bytes of a JSON line, or a parsed element of a JSON array. ``where``
    is ``file:line`` or ``file: item k`` for error messages."""
    if path.suffix == ".json":
        raw = path.read_bytes()
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as err:
            raise EvalDataError(f"{path}:{err.lineno}:{err.colno}: not valid JSON ({err.msg})") from err
        except UnicodeDecodeError as err:
            line = raw.count(b"\n", 0, err.start) + 1
            column = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
            raise EvalDataError(f"{path}:{line}:{column}: {_not_utf8(err)}") from None
        except RecursionError:  # arrays or objects nested past Python's recursion limit
            raise EvalDataError(f"{path}: {TOO_DEEP}") from None
        if not isinstance(data, list):
            raise EvalDataError(f"{path}: expected a JSON array of items, got a JSON {type(data).__name__}")
        for k, item in enumerate(data):
            yield f"{path}: item {k}", item
        return
    with path.open("rb") as f:
        for line_no, line in enumerate(f, start=1):
            if line.strip():
                yield f"{path}:{line_no}", line


def _not_utf8(err: UnicodeDecodeError) -> str:
    return f"not valid UTF-8 (byte 0x{err.object[err.start]:02x}: {err.reason})"


def _parse(where: str, raw: Any) -> Any:
    if not isinstance(raw, bytes):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError as err:
        line = raw.decode(errors="replace").strip()
        raise EvalDataError(f"{where}:{err.colno}: not valid JSON ({err.msg}): {_shown(line)}") from err
    except UnicodeDecodeError as err:  # json.loads decodes bytes first: its error has no place in the file
        raise EvalDataError(f"{where}:{err.start + 1}: {_not_utf8(err)}") from None
    except RecursionError:  # arrays or objects nested past Python's recursion limit
        raise EvalDataError(f"{where}: {TOO_DEEP}") from None


def check_item(where: str, item: Any, pool_size: int | None, needs_context: bool = True) -> None:
    """Raise :class:`EvalDataError` unless ``item`` can be evaluated. ``pool_size``: the size of the document
    pool index contexts point into (None: no pool available). ``needs_context``: the method's agent reads the
    document, so an item without ``context`` is refused (an agent that reads none takes an item without one)."""
    if not isinstance(item, dict):
        raise EvalDataError(f"{where}: an item must be a JSON object, got {_shown(item)}")
    fields = ", ".join(sorted(item))
    index = item.get("index", 0)  # results are keyed by it, and resuming matches it against those keys
    if not isinstance(index, (int, str)) or isinstance(index, bool):
        raise EvalDataError(f"{where}: field 'index' must be an integer or a string, got {_shown(index)}")
    question = item.get("input")
    if not isinstance(question, str) or not question.strip():
        what = "is missing" if "input" not in item else f"must be a non-empty string, got {_shown(question)}"
        raise EvalDataError(f"{where}: field 'input' (the question) {what}; fields: {fields}")
    gold_field = next((f for f in GOLD_FIELDS if f in item), None)
    if gold_field is None:
        raise EvalDataError(f"{where}: no gold answers: neither 'answers' nor 'outputs'; fields: {fields}")
    gold = item[gold_field]
    if not isinstance(gold, list) or not gold:
        raise EvalDataError(f"{where}: field {gold_field!r} must be a non-empty list of strings, got {_shown(gold)}")
    for k, answer in enumerate(gold):
        if not isinstance(answer, str) or not answer.strip():  # "" would be a substring of every prediction
            raise EvalDataError(f"{where}: field {gold_field!r}[{k}] must be a non-empty string, got {_shown(answer)}")
    if "context" not in item and needs_context:
        raise EvalDataError(f"{where}: field 'context' is missing; fields: {fields}")
    context = item.get("context", "")
    texts = [("input", question), *((f"{gold_field!r}[{k}]", a) for k, a in enumerate(gold)), ("context", context)]
    for name, text in texts:
        if isinstance(text, str) and (bad := lone_surrogate(text)) is not None:
            name = name if name.startswith("'") else repr(name)
            raise EvalDataError(
                f"{where}: field {name} holds a lone surrogate, {text[bad]!r} at character {bad}: not a character, "
                "no model can be sent it (a \\ud800-\\udfff escape is half of a pair; write the whole character)"
            )
    if isinstance(context, str):
        return
    if not isinstance(context, list):
        what = f"must be text or a list of document indices, got {_shown(context)}"
        raise EvalDataError(f"{where}: field 'context' {what}")
    if not context:
        raise EvalDataError(f"{where}: field 'context' is an empty list: an item needs at least one document")
    if pool_size is None:
        raise EvalDataError(
            f"{where}: field 'context' lists document indices, which need {POOL_FILE} (the released sets' "
            f"document pool): put it in the data folder or pass --hotpotqa-dev FILE"
        )
    for k, doc in enumerate(context):
        if not isinstance(doc, int) or isinstance(doc, bool) or not 0 <= doc < pool_size:
            raise EvalDataError(
                f"{where}: field 'context'[{k}] = {_shown(doc)} is not a document index of the pool "
                f"(0 ... {pool_size - 1})"
            )


_SURROGATE = re.compile("[\ud800-\udfff]")  # what json.loads leaves of an escape that is half of a pair


def lone_surrogate(text: str) -> int | None:
    """The position of the first lone surrogate in ``text`` (text UTF-8 cannot encode), or None."""
    found = _SURROGATE.search(text)
    return None if found is None else found.start()


_INDEX = re.compile(rb'^\{\s*"index"\s*:\s*(-?\d+)\s*[,}]')  # a line that starts with its index


def scan(
    path: Path,
    limit: int | None = None,
    pool: Path | None = None,
    questions: dict[Any, tuple[str, str]] | None = None,
    needs_context: bool = True,
) -> list[Any]:
    """Check every item of the first ``limit`` and return their ids (``index``, else the position). Every line
    is parsed: a bad item must stop the run before any model call, not when its turn comes. ``questions``, if
    given, receives ``id -> (where, question)`` (for checks that need a tokenizer); ``needs_context``: see
    :func:`check_item`."""
    if pool is not None and not pool.is_file():
        raise EvalDataError(f"{pool}: file not found (the document pool of index contexts, {POOL_FILE})")
    pool_size = len(document_pool(pool)) if pool is not None else None
    ids: list[Any] = []
    seen: dict[Any, str] = {}
    for position, (where, raw) in enumerate(_raw_items(path)):
        if limit is not None and position >= limit:
            break
        item = _parse(where, raw)
        check_item(where, item, pool_size, needs_context)
        index = item.get("index", position)
        if index in seen:
            raise EvalDataError(f"{where}: duplicate item index {index!r} (first at {seen[index]})")
        seen[index] = where
        ids.append(index)
        if questions is not None:
            questions[index] = (where, item["input"])
    if not ids:
        raise EvalDataError(f"{path}: no items (the file is empty)")
    return ids


def iter_items(
    path: Path, limit: int | None = None, only: set[Any] | None = None, pool: Path | None = None
) -> Iterator[dict[str, Any]]:
    """The items of an eval set, one at a time (a 3.5M-token set is ~2 GB): the first ``limit``, and of those
    only the ids in ``only`` (a line that starts with its index is skipped without parsing its context). An
    index context is rendered into text as its item is handed out."""
    for position, (where, raw) in enumerate(_raw_items(path)):
        if limit is not None and position >= limit:
            return
        if only is not None and isinstance(raw, bytes):
            match = _INDEX.match(raw)
            if match and int(match.group(1)) not in only:
                continue
        item = _parse(where, raw)
        item.setdefault("index", position)
        if only is not None and item["index"] not in only:
            continue
        if isinstance(item.get("context"), list):
            if pool is None:
                raise EvalDataError(f"{where}: field 'context' lists document indices but no {POOL_FILE} was given")
            item["context"] = render_context(item["context"], document_pool(pool))
        yield item


def item_count(path: Path) -> int:
    """How many items a file holds (for the report; lines are not parsed)."""
    return sum(1 for _ in _raw_items(path))
