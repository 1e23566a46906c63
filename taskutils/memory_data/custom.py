"""Your own long-context QA data -> the training parquet the trainer reads and the eval set the harness reads.

Input: JSON lines (``.jsonl``, ``.json``, ``.ndjson``: one object per line), parquet, or a folder written by
``datasets``' ``save_to_disk``; several inputs are read in order, as one data set. A record has a question, its
gold answers, and a long context: either one text, or a list of documents (strings, or objects with ``text`` and
an optional ``title``) joined as the HotpotQA sets are (``"Document {i}:\\n{doc}"``, blank lines between; a titled
document is ``"{title}\\n{text}"``). Field names are options; a dotted name reaches into an object
(``answers.text`` for SQuAD-style ``{"text": [...], "answer_start": [...]}``).

Every record is checked before anything is written, and every problem is reported (the first
:data:`MAX_PROBLEMS`), each as ``FILE:LINE field 'x': problem`` (JSON lines, lines from 1) or
``FILE: row K field 'x': problem`` (parquet and ``datasets`` folders, rows from 0, as ``ds[K]``). Answers may be
one string (taken as the only answer) or a non-empty list of strings; anything else is an error, numbers
included (``1984`` must be written ``"1984"``: the verifiers compare text). One string that is the text of a list
(``"['Arecibo', 'Puerto Rico']"``, as a table that stored a list as text holds it; ``"[1984]"`` too) is an error
too: it would be one answer no reply can match; ``answer_lists`` says to read it as the list (``parse``) or keep it
(``literal``). Text with a lone surrogate (``"\\ud800"``, half of a pair, which UTF-8 cannot hold) is an error naming
the field. A record with the question and context of an earlier one (white space at their ends aside), or with an
earlier record's id, is an error (with a held-out split, one question would be both trained on and evaluated);
``duplicates="keep-first"`` keeps the first of each and drops the others, counted in the summary. Fields a record
has that no option names are not written: the summary lists them.

Outputs, each written under a temporary name and renamed when complete (a file with the final name is always a
whole one): training rows (parquet, :func:`taskutils.memory_data.hotpotqa.memory_row`) for ``data.train_files``
and ``data.val_files``, and an eval set of JSON lines (:func:`taskutils.memory_data.hotpotqa.eval_item`) named
``eval_{N}.jsonl``: the harness finds it as task ``hotpotqa``, length ``N``. An eval item's ``index`` is the record's
id (the ``id`` field, an integer or a string) when it has one, else its position in the input (from 0); a training
row's ``extra_info.index`` is the position, and ``extra_info.id`` the id as text when the records have ids, so a
held-out item can be traced back.
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import re
import statistics
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recurrent.atomic import atomic_path
from taskutils.memory_data.hotpotqa import eval_item, memory_row, parquet_schema, render_context
from taskutils.memory_data.output import write_parquet
from taskutils.memory_data.sources import hotpotqa_doc
from taskutils.memory_eval.evalsets import lone_surrogate

MAX_PROBLEMS = 20  # problems listed; the rest are counted
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
EVAL_NAME = re.compile(r"^eval_(\d+)\.jsonl$")  # what the harness looks for (task hotpotqa, length N)
DEFAULT_DATA_SOURCE = "custom"
DUPLICATES = ("error", "keep-first")  # what a repeated record or id is
ANSWER_LISTS = ("error", "parse", "literal")  # what an answers string that is the text of a list becomes


class CustomDataError(ValueError):
    """The input or the options cannot make a data set; the message lists every problem found."""


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


@dataclass(frozen=True)
class Source:
    path: Path
    kind: str  # "jsonl" | "parquet" | "datasets"
    split: str | None = None  # the split of a DatasetDict folder


@dataclass
class Outputs:
    train: Path | None = None  # training rows (parquet)
    val: Path | None = None  # training rows of the held-out records, for data.val_files (parquet)
    eval: Path | None = None  # the harness's eval set, eval_{N}.jsonl

    def given(self) -> dict[str, Path]:
        return {k: v for k, v in (("train", self.train), ("val", self.val), ("eval", self.eval)) if v is not None}


@dataclass
class Report:
    records: int
    written: dict[str, tuple[Path, int]]  # output kind -> (path, records)
    context_tokens: list[int] = field(default_factory=list)  # per record, when a tokenizer was given
    question_tokens: list[int] = field(default_factory=list)
    dropped: dict[int, str] = field(default_factory=dict)  # position -> where and why (duplicates="keep-first")
    ignored: Counter = field(default_factory=Counter)  # field -> records that have it, not written
    with_ids: bool = False  # some record has an id: the training rows carry extra_info.id


# -- reading ----------------------------------------------------------------------------------------------


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def open_sources(paths: list[Path], split: str | None = None) -> tuple[list[Source], list[str]]:
    """What each input is, and the problems: a missing path, an unknown kind, a folder ``datasets`` did not
    write, or a ``datasets`` folder of several splits without ``split``. Nothing is read yet."""
    sources, problems = [], []
    for path in map(Path, paths):
        if path.is_dir():
            try:
                sources.append(Source(path, "datasets", _dataset_split(path, split)))
            except CustomDataError as err:
                problems.append(str(err))
        elif not path.is_file():
            problems.append(f"{path}: no such file or folder")
        elif path.suffix == ".parquet":
            sources.append(Source(path, "parquet"))
        elif path.suffix in JSONL_SUFFIXES:
            sources.append(Source(path, "jsonl"))
        else:
            problems.append(
                f"{path}: unknown input kind {path.suffix!r}: JSON lines ({', '.join(JSONL_SUFFIXES)}), "
                "parquet (.parquet) or a datasets save_to_disk folder"
            )
    return sources, problems


def _dataset_split(path: Path, split: str | None) -> str | None:
    """The split to read of a ``save_to_disk`` folder (None for a single Dataset)."""
    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        if split is None and len(splits) == 1:
            return splits[0]
        if split not in splits:
            asked = "no --split given" if split is None else f"--split {split!r} is not one of them"
            raise CustomDataError(f"{path}: a datasets folder with splits {', '.join(splits)}; {asked}")
        return split
    if not (path / "state.json").is_file():
        raise CustomDataError(
            f"{path}: a folder, but not one written by datasets' save_to_disk (no state.json or dataset_dict.json)"
        )
    return None


class _Unreadable(str):
    """A record that could not be read at all (a JSON line that does not parse): the message."""


def iter_raw(source: Source) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` per record, where ``where`` names the file and the line or row."""
    if source.kind == "jsonl":
        yield from _iter_jsonl(source.path)
    elif source.kind == "parquet":
        import pyarrow.parquet as pq

        row = 0
        for batch in pq.ParquetFile(source.path).iter_batches(batch_size=256):
            for record in batch.to_pylist():
                yield f"{source.path}: row {row}", record
                row += 1
    else:
        from datasets import load_from_disk

        data = load_from_disk(str(source.path))
        name = str(source.path)
        if source.split is not None:
            data, name = data[source.split], f"{source.path} [{source.split}]"
        for row, record in enumerate(data):
            yield f"{name}: row {row}", record


def _iter_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open("rb") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            if line_no == 1 and line.lstrip().startswith(b"["):
                yield (
                    where,
                    _Unreadable(
                        "a JSON array; this command reads JSON lines, one object per line (convert: jq -c '.[]')"
                    ),
                )
                return
            try:
                record = json.loads(line)
            except ValueError as err:  # JSONDecodeError, and UnicodeDecodeError for bytes that are not UTF-8
                record = _Unreadable(f"not valid JSON ({err})")
            except RecursionError:  # arrays or objects nested past Python's recursion limit
                record = _Unreadable(f"JSON nested too deep to read ({_depth(line):,} levels at its deepest)")
            yield where, record


def _depth(line: bytes) -> int:
    """How deep a JSON line's arrays and objects nest (brackets in strings counted too: a measure for a message)."""
    depth = deepest = 0
    for byte in line:
        if byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif byte in b"]}":
            depth -= 1
    return deepest


# -- checking ---------------------------------------------------------------------------------------------

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
    if isinstance(record, _Unreadable):
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


def _repeats(
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


def check(
    sources: list[Source],
    fields: Fields,
    tokenizer: Any = None,
    max_question_tokens: int | None = None,
    *,
    duplicates: str = "error",
    answer_lists: str = "error",
) -> Report:
    """Read every record once and raise :class:`CustomDataError` listing the problems, if any. With a tokenizer,
    token counts are gathered and a question over ``max_question_tokens`` is a problem (the trainer stops on one).
    A repeated record or id is a problem, or with ``duplicates="keep-first"`` dropped (``Report.dropped``)."""
    from taskutils.memory_data.tokenizer import count_tokens

    if duplicates not in DUPLICATES:
        raise CustomDataError(f"duplicates must be one of {', '.join(DUPLICATES)}, got {duplicates!r}")
    if answer_lists not in ANSWER_LISTS:
        raise CustomDataError(f"answer_lists must be one of {', '.join(ANSWER_LISTS)}, got {answer_lists!r}")
    report = Report(records=0, written={})
    problems: list[str] = []
    total, bad = 0, 0
    seen: dict[bytes, str] = {}
    indices: dict[int | str, tuple[str, bool]] = {}
    for where, example, found in iter_examples(sources, fields, answer_lists, report.ignored):
        report.records += 1
        if example is not None:
            report.with_ids = report.with_ids or example.id is not None
            repeats = _repeats(example, where, fields, seen, indices)
            if repeats and duplicates == "keep-first":
                report.dropped[example.index] = f"{where}: {'; '.join(repeats)}"
            elif repeats:
                found = found + [*repeats[:-1], f"{repeats[-1]}; --duplicates keep-first keeps the first of each"]
        if example is not None and tokenizer is not None:
            question = count_tokens(example.question, tokenizer)
            report.question_tokens.append(question)
            report.context_tokens.append(count_tokens(example.context, tokenizer))
            if max_question_tokens is not None and question > max_question_tokens:
                found.append(
                    f"field {fields.question!r}: {question} tokens, over the trainer's question budget of "
                    f"{max_question_tokens} (recurrent.config.max_prompt_length)"
                )
        if found:
            bad += 1
            total += len(found)
            problems += [f"{where} {p}" if p.startswith("field") else f"{where}: {p}" for p in found]
    if report.records == 0:
        raise CustomDataError(f"no records in {', '.join(str(s.path) for s in sources)}")
    if problems:
        more = [f"... and {total - MAX_PROBLEMS} more"] if total > MAX_PROBLEMS else []
        raise CustomDataError(
            f"{total} problem(s) in {bad} of {report.records} records; nothing was written:\n  "
            + "\n  ".join(problems[:MAX_PROBLEMS] + more)
        )
    return report


# -- writing ----------------------------------------------------------------------------------------------


def eval_length(path: Path) -> int:
    """N of an eval set named ``eval_{N}.jsonl`` (:func:`output_problems` refuses any other name)."""
    return int(EVAL_NAME.match(Path(path).name).group(1))


def output_problems(outputs: Outputs, eval_fraction: float | None, inputs: list[Path]) -> list[str]:
    """What is wrong with the outputs and the split, before any input is read."""
    problems = []
    given = outputs.given()
    if not given:
        problems.append("no output: give --train-out, --val-out and/or --eval-out")
    if outputs.train is not None and outputs.train.suffix != ".parquet":
        problems.append(f"--train-out {outputs.train}: must end in .parquet (verl's dataset reads parquet)")
    if outputs.val is not None and outputs.val.suffix != ".parquet":
        problems.append(f"--val-out {outputs.val}: must end in .parquet (verl's dataset reads parquet)")
    if outputs.eval is not None and not EVAL_NAME.match(outputs.eval.name):
        problems.append(
            f"--eval-out {outputs.eval}: the harness finds eval sets by name; call it eval_N.jsonl (N: a number "
            "to select it with, --lengths N)"
        )
    if eval_fraction is not None:
        if not 0 < eval_fraction < 1:
            problems.append(f"--eval-fraction {eval_fraction}: must be between 0 and 1")
        if outputs.train is None or (outputs.val is None and outputs.eval is None):
            problems.append("--eval-fraction splits the records: give --train-out and --val-out or --eval-out")
    resolved = {p.resolve() for p in inputs}
    problems += [f"--{k}-out {p}: is also an input" for k, p in given.items() if p.resolve() in resolved]
    paths = [p.resolve() for p in given.values()]
    if len(set(paths)) < len(paths):
        problems.append("two outputs have the same path")
    return problems


def held_out(records: int, eval_fraction: float | None, seed: int, dropped: frozenset[int] = frozenset()) -> set[int]:
    """Indices of the held-out records among those kept (``dropped``: not written): ``round(fraction * kept)`` of
    them, at least 1 and leaving at least 1 for training, drawn with ``seed`` (the same input and seed always hold
    out the same records)."""
    if eval_fraction is None:
        return set()
    kept = [index for index in range(records) if index not in dropped]
    if len(kept) < 2:
        raise CustomDataError(f"--eval-fraction needs at least 2 records to split, the input has {len(kept)}")
    count = min(max(1, round(eval_fraction * len(kept))), len(kept) - 1)
    return set(random.Random(f"custom/{seed}").sample(kept, count))


def prepare(
    inputs: list[Path], outputs: Outputs, eval_fraction: float | None = None, split: str | None = None
) -> list[Source]:
    """The inputs as sources, once the options and the inputs' kinds are known to work (nothing is read yet):
    raises :class:`CustomDataError` listing every problem of both."""
    sources, problems = open_sources(inputs, split)
    problems = output_problems(outputs, eval_fraction, [Path(p) for p in inputs]) + problems
    if problems:
        raise CustomDataError("cannot start (nothing was read or written):\n  " + "\n  ".join(problems))
    return sources


def build(
    sources: list[Source],
    fields: Fields,
    outputs: Outputs,
    *,
    eval_fraction: float | None = None,
    seed: int = 42,
    data_source: str = DEFAULT_DATA_SOURCE,
    tokenizer: Any = None,
    max_question_tokens: int | None = None,
    duplicates: str = "error",
    answer_lists: str = "error",
) -> Report:
    """Check every record of ``sources`` (from :func:`prepare`), then write the outputs (see the module
    docstring). Without ``eval_fraction`` every output gets every record; with it, ``train`` gets the rest and
    ``val`` / ``eval`` the held-out ones. Records dropped as duplicates go to none."""
    report = check(sources, fields, tokenizer, max_question_tokens, duplicates=duplicates, answer_lists=answer_lists)
    held = held_out(report.records, eval_fraction, seed, frozenset(report.dropped))
    schema = _training_schema(report.with_ids)

    def wanted(kind: str) -> Iterator[Example]:
        for _, example, _ in iter_examples(sources, fields, answer_lists):
            assert example is not None  # check() passed
            if example.index in report.dropped:
                continue
            if eval_fraction is None or (example.index in held) == (kind != "train"):
                yield example

    counts = dict.fromkeys(outputs.given(), 0)

    def counted(kind: str, rows: Iterator[dict]) -> Iterator[dict]:
        for row in rows:
            counts[kind] += 1
            yield row

    with ExitStack() as stack:  # every output appears under its name only when all are complete
        for kind, path in outputs.given().items():
            tmp = stack.enter_context(atomic_path(path))
            try:
                if kind == "eval":
                    items = (
                        eval_item(ex.question, ex.answers, ex.context, ex.item_index, ex.num_docs)
                        for ex in wanted(kind)
                    )
                    write_eval_set(counted(kind, items), tmp)
                else:
                    rows = (_training_row(ex, data_source, report.with_ids) for ex in wanted(kind))
                    write_parquet(counted(kind, rows), tmp, schema)
            except OSError as err:  # a full disk: name the output, not its temporary file (or no file at all)
                raise OSError(err.errno, err.strerror or str(err), str(path)) from err
    report.written = {kind: (path, counts[kind]) for kind, path in outputs.given().items()}
    return report


def write_eval_set(items: Iterator[dict[str, Any]], dest: Path) -> None:
    """The eval set's items as JSON lines."""
    with dest.open("w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(item, ensure_ascii=False) + "\n")


def _training_schema(with_ids: bool) -> Any:
    """The training parquet's schema (hotpotqa's), with ``extra_info.id`` (text) when the records have ids."""
    import pyarrow as pa

    schema = parquet_schema()
    if not with_ids:
        return schema
    at = schema.get_field_index("extra_info")
    extra = schema.field(at).type
    fields = [extra.field(i) for i in range(extra.num_fields)] + [pa.field("id", pa.string())]
    return schema.set(at, pa.field("extra_info", pa.struct(fields)))


def _training_row(example: Example, data_source: str, with_ids: bool) -> dict[str, Any]:
    ex = example
    row = memory_row(ex.question, ex.answers, ex.context, ex.index, ex.num_docs, data_source)
    if with_ids:
        row["extra_info"]["id"] = None if ex.id is None else str(ex.id)
    return row


def summary(report: Report, max_context_tokens: int | None = None) -> str:
    """What was read and written, and how to use it."""
    lines = [f"{report.records} records checked"]
    if report.dropped:
        lines.append(f"{len(report.dropped)} repeated record(s) dropped (--duplicates keep-first), the first kept:")
        shown = list(report.dropped.values())
        lines += [f"  {why}" for why in shown[:MAX_PROBLEMS]]
        lines += [f"  ... and {len(shown) - MAX_PROBLEMS} more"] if len(shown) > MAX_PROBLEMS else []
    if report.ignored:
        counts = ", ".join(f"{name} ({count} records)" for name, count in sorted(report.ignored.items()))
        lines.append(f"fields not written (no option names them): {counts}")
    names = {"train": "training rows", "val": "validation rows", "eval": "eval items"}
    for kind, (path, count) in report.written.items():
        lines.append(f"{names[kind]:15} {count:6d} -> {path}")
    if report.context_tokens:
        ctx, q = report.context_tokens, report.question_tokens
        lines.append(
            f"context tokens: min {min(ctx):,}, median {statistics.median(ctx):,.0f}, max {max(ctx):,}; "
            f"question tokens: max {max(q):,}"
        )
        if max_context_tokens is not None:
            over = sum(1 for n in ctx if n > max_context_tokens)
            lines.append(
                f"{over} context(s) over {max_context_tokens:,} tokens: training centre-truncates them "
                "(recurrent.config.max_chunks x chunk_size)"
            )
    if "train" in report.written or "val" in report.written:
        # Absolute: the trainer's dataset is read in a Ray worker, whose working folder need not be this one.
        train = report.written.get("train", report.written.get("val"))[0].resolve()
        val = report.written.get("val", report.written.get("train"))[0].resolve()
        lines.append(f"train: bash run_memory_7B.sh data.train_files={train} data.val_files={val}")
    if "eval" in report.written:
        path = report.written["eval"][0]
        lines.append(
            f"evaluate: python -m taskutils.memory_eval.run --data-dir {path.parent} --tasks hotpotqa "
            f"--lengths {eval_length(path)} --models MODEL"
        )
    return "\n".join(lines)
