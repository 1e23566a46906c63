"""Results in the original's layout, for its ``visualize.py`` and other tools of the original:

    python -m taskutils.memory_eval.to_original RESULTS_DIR OUT_DIR

Each ``RESULTS_DIR/<task>_<L>/<model>__<method>.jsonl`` becomes ``OUT_DIR/ruler_hqa_<L>/<name>.jsonl`` (HotpotQA at
L documents) or ``OUT_DIR/ruler_<task>_<L>/<name>.jsonl`` (a RULER task; any other task keeps ``<task>_<L>``), one
line per item with the original's fields: ``index``, ``input``, ``answers``, ``answer`` (the first gold),
``response``, ``pred`` and ``judge_sub_em`` (``judge_em``, ``judge_f1`` where the task has them). ``<name>`` is the
model's name as the original's configurations named it, or ``<model>-<method>`` where one folder holds the model
under several methods. A failed item is written with ``judge_sub_em`` 0 and its ``error``, as the harness counts
it (the original dropped it; its ``visualize.py`` prints the path of a file without 128 lines). Point
``visualize.py`` at the output: it reads ``results/ruler_hqa*/*.jsonl`` from its working directory, so
``OUT_DIR`` is such a ``results`` folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from recurrent.atomic import write_atomic
from recurrent.resume import read_jsonl
from taskutils.memory_eval import config as cfg
from taskutils.memory_eval.report import results_files

JUDGED = ("sub_em", "em", "f1")  # our metric -> the original's judge_<metric>


def original_folder(task: str, length: int) -> str:
    """The original's results folder of a task at a length."""
    if task == cfg.HOTPOTQA:
        return f"ruler_hqa_{length}"
    if task in cfg.RULER_TASKS or task in cfg.RULER_EXTRA_TASKS:
        return f"ruler_{task}_{length}"
    return f"{task}_{length}"


def original_line(record: dict[str, Any]) -> dict[str, Any]:
    """One item of ours in the original's fields."""
    gold = record.get("gold") or []
    line = {
        "index": record["id"],
        "input": record.get("question"),
        "answers": gold,
        "answer": gold[0] if gold else None,
        "response": record.get("response") or "",
        "pred": record.get("pred") or "",
    }
    failed = bool(record.get("error"))
    for metric in JUDGED:
        value = record.get(metric)
        if value is not None or (failed and metric == "sub_em"):
            line[f"judge_{metric}"] = 0 if failed else value
    if failed:
        line["error"] = record["error"]
    return line


def convert(results_dir: Path, out_dir: Path) -> list[Path]:
    """Write every results file of ``results_dir`` in the original's layout under ``out_dir``; the files written."""
    found = []
    for path, task, length in results_files(results_dir):
        model, _, method = path.stem.partition("__")
        found.append((path, task, length, model, method))
    # A model under several methods in one folder: each gets its method in its name.
    shared = Counter((task, length, model) for _, task, length, model, _ in found)
    written = []
    for path, task, length, model, method in found:
        name = model if shared[(task, length, model)] == 1 else f"{model}-{method}"
        lines = [original_line(record) for record in read_jsonl(path)]
        target = out_dir / original_folder(task, length) / f"{name}.jsonl"
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m taskutils.memory_eval.to_original",
        description=__doc__.split("\n\n")[0],
        epilog="The layout and fields: the module's docstring (taskutils/memory_eval/to_original.py).",
    )
    parser.add_argument("results_dir", type=Path, help="the harness's results folder")
    parser.add_argument("out_dir", type=Path, help="the original's results folder to write (its visualize.py's)")
    args = parser.parse_args(argv)
    if not args.results_dir.is_dir():
        parser.exit(2, f"{parser.prog}: error: {args.results_dir}: no such results folder\n")
    written = convert(args.results_dir, args.out_dir)
    if not written:
        parser.exit(2, f"{parser.prog}: error: {args.results_dir}: no <task>_<L>/<model>__<method>.jsonl file\n")
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
