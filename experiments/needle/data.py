"""The needle task's files: training, validation and test rows and the eval sets (:mod:`experiments.needle.needle`).

    python -m experiments.needle.data --out DIR [--train 2000] [--validation 32] [--test 32]
        [--train-chunks 1 4] [--eval-chunks 1 2 4] [--seed 0] [--tokenizer DIR] [--late-start 0.0]
        [--decoy-start 0.0] [--distractors 0 --task needle]

writes ``DIR/train.parquet`` (train split, 1-4 chunks), ``DIR/validation.parquet`` and ``DIR/test.parquet``
(verl rows, every eval length), and ``DIR/eval/{split}/eval_needle_{N}.jsonl`` (eval-set JSON lines,
``taskutils.memory_eval.evalsets``: ``index``, ``input``, ``context``, ``answers``, and ``needle_chunk`` for the
survival analysis). ``--late-start S``: a share S of the training documents are episodes that start late (the
needle already in the row's ``memory`` column, filler chunks only: :func:`make_late_start`); ``--decoy-start D``:
a share D start from a wrong memory (the asked key's needle with another number; the real needle in the context:
:func:`make_decoy_start`).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from experiments.needle.needle import eval_item, make_documents, verl_row
from experiments.needle.reader import load_or_build_tokenizer


def write(
    out: str | Path,
    tokenizer: Any,
    train: int = 2000,
    validation: int = 32,
    test: int = 32,
    train_chunks: tuple[int, int] = (1, 4),
    eval_chunks: tuple[int, ...] = (1, 2, 4),
    seed: int = 0,
    late_start: float = 0.0,
    decoy_start: float = 0.0,
    distractors: int = 0,
    task: str = "needle",
) -> dict[str, Path]:
    """Write the parquet rows and eval-set files (``eval_{task}_{N}.jsonl``) under ``out``; returns the paths.
    ``distractors``: the choosing task's other needles per document (:func:`make_choice_document`).
    ``validation`` and ``test`` are counts per eval length; ``late_start``: the share of training documents that
    are episodes starting late (:func:`make_late_start`), ``decoy_start`` from a wrong memory
    (:func:`make_decoy_start`)."""
    import pandas as pd

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    lengths = list(range(train_chunks[0], train_chunks[1] + 1))
    train_docs = make_documents(tokenizer, "train", train, lengths, seed, late_start, decoy_start, distractors)
    paths["train"] = out / "train.parquet"
    pd.DataFrame([verl_row(d, "train", i) for i, d in enumerate(train_docs)]).to_parquet(paths["train"])
    for split, count in (("validation", validation), ("test", test)):
        rows = []
        for n in eval_chunks:
            docs = make_documents(tokenizer, split, count, [n], seed=seed * 1000 + n, distractors=distractors)
            folder = out / "eval" / split
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"eval_{task}_{n}.jsonl"
            with path.open("w") as f:
                for i, d in enumerate(docs):
                    f.write(json.dumps(eval_item(d, i)) + "\n")
            paths[f"{split}_{n}"] = path
            rows += [verl_row(d, split, len(rows) + i) for i, d in enumerate(docs)]
        paths[split] = out / f"{split}.parquet"
        pd.DataFrame(rows).to_parquet(paths[split])
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.needle.data", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--validation", type=int, default=32, help="documents per eval length")
    parser.add_argument("--test", type=int, default=32, help="documents per eval length")
    parser.add_argument("--train-chunks", type=int, nargs=2, default=[1, 4], metavar=("MIN", "MAX"))
    parser.add_argument("--eval-chunks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--late-start",
        type=float,
        default=0.0,
        help="share of training documents that start late: the needle already in memory, filler chunks only",
    )
    parser.add_argument(
        "--decoy-start",
        type=float,
        default=0.0,
        help="share of training documents that start from a wrong memory: the asked key's needle with another number",
    )
    parser.add_argument(
        "--distractors",
        type=int,
        default=0,
        help="the choosing task: this many more needles of other keys in every document (0: the needle task)",
    )
    parser.add_argument(
        "--task", default="needle", help="the eval sets' task name: eval_<task>_<N>.jsonl (the harness's --tasks)"
    )
    parser.add_argument("--tokenizer", type=Path, default=None, help="reader tokenizer folder (default: build it)")
    args = parser.parse_args(argv)
    for flag, share in (("--late-start", args.late_start), ("--decoy-start", args.decoy_start)):
        if not 0.0 <= share <= 1.0:
            parser.error(f"{flag} is a share of the training documents, in [0, 1]; got {share}")
    if args.late_start + args.decoy_start > 1.0:
        parser.error(f"--late-start + --decoy-start must be at most 1; got {args.late_start} + {args.decoy_start}")
    if args.distractors < 0:
        parser.error(f"--distractors must be >= 0, got {args.distractors}")
    if args.distractors and (args.late_start or args.decoy_start):
        parser.error("--distractors (the choosing task) takes no --late-start or --decoy-start")
    if not re.fullmatch(r"[a-z][a-z0-9]*", args.task):
        parser.error(f"--task must be a lower-case word (it names eval_<task>_<N>.jsonl), got {args.task!r}")
    tokenizer = load_or_build_tokenizer(args.tokenizer)
    paths = write(
        args.out,
        tokenizer,
        args.train,
        args.validation,
        args.test,
        tuple(args.train_chunks),
        tuple(args.eval_chunks),
        args.seed,
        args.late_start,
        args.decoy_start,
        args.distractors,
        args.task,
    )
    for name, path in paths.items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
