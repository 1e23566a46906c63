"""The calculator agent's toy task: two-operand arithmetic problems, split so that no problem is shared.

A problem is "What is A OP B?" with A and B of two digits and OP one of + - *; the answer is the exact integer.
Splits are disjoint by problem: a problem (A, OP, B) belongs to split ``(A * 7 + B * 3 + OP_INDEX) % 3`` (0 train,
1 validation, 2 test), so a held-out problem was never seen in training (its operands were, in other problems).

    python -m experiments.calculator.task --out DIR [--train 2000] [--validation 64] [--test 128] [--seed 0]

writes ``DIR/{train,validation,test}.parquet`` (verl rows: ``prompt`` as a chat list, ``data_source``,
``reward_model.ground_truth``, ``extra_info``) and ``DIR/eval/{split}/eval_calculator_2.jsonl`` (``index``, ``input``,
``context`` (empty), ``answers``: the evaluation harness's format; task ``calculator`` at "length" 2, the operands'
digits):

    python -m taskutils.memory_eval.run --method calculator --tasks calculator --lengths 2 --data-dir DIR/eval/test ...
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "validation", "test")
DATA_SOURCE = "calculator_arithmetic"
OPERATORS = ("+", "-", "*")
LOW, HIGH = 10, 99  # two-digit operands
EVAL_TASK, EVAL_LENGTH = "calculator", 2  # the harness's task name and "length" (digits per operand)


@dataclass(frozen=True)
class Problem:
    a: int
    op: str
    b: int

    @property
    def question(self) -> str:
        return f"What is {self.a} {self.op} {self.b}?"

    @property
    def answer(self) -> int:
        return {"+": self.a + self.b, "-": self.a - self.b, "*": self.a * self.b}[self.op]

    @property
    def split(self) -> str:
        return SPLITS[(self.a * 7 + self.b * 3 + OPERATORS.index(self.op)) % 3]


def problems(split: str, count: int, seed: int) -> list[Problem]:
    """``count`` distinct problems of ``split``, in a seeded random order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    pool = [Problem(a, op, b) for a in range(LOW, HIGH + 1) for op in OPERATORS for b in range(LOW, HIGH + 1)]
    pool = [p for p in pool if p.split == split]
    if count > len(pool):
        raise ValueError(f"the {split} split has {len(pool)} problems, {count} asked")
    return random.Random(f"{seed}-{split}").sample(pool, count)


def verl_row(problem: Problem, split: str, index: int) -> dict:
    return {
        "prompt": [{"role": "user", "content": problem.question}],
        "data_source": DATA_SOURCE,
        "reward_model": {"style": "rule", "ground_truth": str(problem.answer)},
        "extra_info": {"split": split, "index": index, "a": problem.a, "op": problem.op, "b": problem.b},
    }


def write(out: Path, counts: dict[str, int], seed: int) -> dict[str, Path]:
    """Write every split's parquet and eval file under ``out``; returns the parquet paths."""
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, count in counts.items():
        chosen = problems(split, count, seed)
        paths[split] = out / f"{split}.parquet"
        pd.DataFrame([verl_row(p, split, i) for i, p in enumerate(chosen)]).to_parquet(paths[split])
        eval_dir = out / "eval" / split
        eval_dir.mkdir(parents=True, exist_ok=True)
        with open(eval_dir / f"eval_{EVAL_TASK}_{EVAL_LENGTH}.jsonl", "w") as f:
            for i, p in enumerate(chosen):
                record = {"index": i, "input": p.question, "context": "", "answers": [str(p.answer)]}
                f.write(json.dumps(record) + "\n")
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the parquet and eval files")
    parser.add_argument("--train", type=int, default=2000, help="training problems (default 2000)")
    parser.add_argument("--validation", type=int, default=64, help="validation problems (default 64)")
    parser.add_argument("--test", type=int, default=128, help="test problems (default 128)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    counts = {"train": args.train, "validation": args.validation, "test": args.test}
    for split, count in counts.items():
        if count < 0:
            parser.error(f"--{split} must be >= 0, got {count}")
    for split, path in write(args.out, counts, args.seed).items():
        print(f"{split}: {counts[split]} problems -> {path}")


if __name__ == "__main__":
    main()
