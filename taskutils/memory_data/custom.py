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

import statistics
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taskutils.memory_data.custom_inputs import CustomDataError, Source, open_sources
from taskutils.memory_data.custom_outputs import Outputs, eval_length, held_out, output_problems, write_outputs
from taskutils.memory_data.custom_records import Example, Fields, find_repeats, iter_examples

MAX_PROBLEMS = 20  # problems listed; the rest are counted
DEFAULT_DATA_SOURCE = "custom"
DUPLICATES = ("error", "keep-first")  # what a repeated record or id is
ANSWER_LISTS = ("error", "parse", "literal")  # what an answers string that is the text of a list becomes


@dataclass
class Report:
    records: int
    written: dict[str, tuple[Path, int]]  # output kind -> (path, records)
    context_tokens: list[int] = field(default_factory=list)  # per record, when a tokenizer was given
    question_tokens: list[int] = field(default_factory=list)
    dropped: dict[int, str] = field(default_factory=dict)  # position -> where and why (duplicates="keep-first")
    ignored: Counter = field(default_factory=Counter)  # field -> records that have it, not written
    with_ids: bool = False  # some record has an id: the training rows carry extra_info.id


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
            repeats = find_repeats(example, where, fields, seen, indices)
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

    def wanted(kind: str) -> Iterator[Example]:
        for _, example, _ in iter_examples(sources, fields, answer_lists):
            assert example is not None  # check() passed
            if example.index in report.dropped:
                continue
            if eval_fraction is None or (example.index in held) == (kind != "train"):
                yield example

    counts = write_outputs(outputs, wanted, data_source, report.with_ids)
    report.written = {kind: (path, counts[kind]) for kind, path in outputs.given().items()}
    return report


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
