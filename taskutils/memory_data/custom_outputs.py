"""The outputs of ``python -m taskutils.memory_data custom`` (taskutils/memory_data/custom.py): which are asked for and
whether they can be written, which records are held out, and the writing itself: training rows (parquet,
:func:`taskutils.memory_data.hotpotqa.memory_row`) and the harness's eval set (JSON lines,
:func:`taskutils.memory_data.hotpotqa.eval_item`), each under a temporary name renamed when all are complete."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recurrent.atomic import atomic_path
from taskutils.memory_data.custom_inputs import CustomDataError
from taskutils.memory_data.custom_records import Example
from taskutils.memory_data.hotpotqa import eval_item, memory_row, parquet_schema
from taskutils.memory_data.output import write_parquet

EVAL_NAME = re.compile(r"^eval_(\d+)\.jsonl$")  # what the harness looks for (task hotpotqa, length N)


@dataclass
class Outputs:
    train: Path | None = None  # training rows (parquet)
    val: Path | None = None  # training rows of the held-out records, for data.val_files (parquet)
    eval: Path | None = None  # the harness's eval set, eval_{N}.jsonl

    def given(self) -> dict[str, Path]:
        return {k: v for k, v in (("train", self.train), ("val", self.val), ("eval", self.eval)) if v is not None}


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
    resolved = {_resolved(p) for p in inputs}
    problems += [f"--{k}-out {p}: is also an input" for k, p in given.items() if _resolved(p) in resolved]
    paths = [_resolved(p) for p in given.values()]
    if len(set(paths)) < len(paths):
        problems.append("two outputs have the same path")
    return problems


def _resolved(path: Path) -> Path:
    """The path with its links followed; as given when they loop (the input's own problem, named there)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):
        return path


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


def write_outputs(
    outputs: Outputs, examples: Callable[[str], Iterator[Example]], data_source: str, with_ids: bool
) -> dict[str, int]:
    """Each output written with ``examples(kind)``, and how many records each got: every output appears under its
    name only once all are complete; a write that fails names its output."""
    schema = _training_schema(with_ids)
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
                        for ex in examples(kind)
                    )
                    write_eval_set(counted(kind, items), tmp)
                else:
                    rows = (_training_row(ex, data_source, with_ids) for ex in examples(kind))
                    write_parquet(counted(kind, rows), tmp, schema)
            except OSError as err:  # a full disk: name the output, not its temporary file (or no file at all)
                raise OSError(err.errno, err.strerror or str(err), str(path)) from err
    return counts


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
