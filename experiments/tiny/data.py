"""Tiny generated tasks for smoke-training on CPU.

``copy`` (default; verl's stock ``single_turn_agent``): each prompt asks the model to repeat a short word
sequence; the answer is the sequence itself, which :mod:`experiments.tiny.reward` scores densely
(similarity, not exact match), so even the random tiny model gets rewards that differ within a GRPO group
and the advantages are non-zero. Columns, as verl's ``RLHFDataset`` expects (``utils/dataset/rl_dataset.py``):
``prompt`` (a chat list), ``data_source``, ``reward_model`` (``{"style": "rule", "ground_truth": ...}``),
``extra_info``.

``memory`` (the ``memory_agent`` loop): a needle in a haystack. A question "What is the <key>?" about a
generated document (``context`` column: 8-24 filler sentences, about 80-250 tokens of the tiny tokenizer, i.e.
2-4 chunks of 64 tokens, with the fact "The <key> is <number>." at a random place), the number as the answer;
scored by :func:`experiments.tiny.reward.compute_memory_score`. ``--sentences MIN MAX`` sets the document
length: ``--sentences 2900 3200`` makes paper-size documents of about 28K tokens (about 9 tokens per sentence,
measured with SmolLM2's tokenizer), 6 chunks of 5000 tokens (scripts/smoke_gpu.sh).

    python -m experiments.tiny.data --out DIR [--task copy|memory] [--train 32] [--val 8] [--seed 0]
                                    [--sentences MIN MAX]

writes ``DIR/train.parquet`` and ``DIR/val.parquet`` (and ``DIR/dev.parquet``, the same rows, the name the
memory configs use).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

DATA_SOURCE = "toy_copy"
WORDS = (
    "the river city magic number answer memory section document year film team key value born special "
    "question problem article previous update"
).split()


def make_rows(count: int, split: str, seed: int) -> list[dict]:
    """``count`` prompts: 'Repeat exactly: <2-4 words>' with the words as ground truth."""
    rng = random.Random(f"{seed}-{split}")
    rows = []
    for index in range(count):
        answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 4)))
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"Repeat exactly: {answer}"}],
                "data_source": DATA_SOURCE,
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": index},
            }
        )
    return rows


MEMORY_SOURCE = "toy_memory"
KEYS = ("magic number", "special value", "key year", "team number")


def make_memory_rows(count: int, split: str, seed: int, sentences: tuple[int, int] = (8, 24)) -> list[dict]:
    """``count`` questions 'What is the <key>?' about a document of ``sentences`` (min, max) filler sentences
    stating it once. Rows are a prefix-stable sequence: the first k rows do not depend on ``count``."""
    rng = random.Random(f"{seed}-{split}-memory")
    rows = []
    for index in range(count):
        key, value = rng.choice(KEYS), str(rng.randint(10, 9999))
        filler = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 10))).capitalize() + "."
            for _ in range(rng.randint(*sentences))
        ]
        filler.insert(rng.randrange(len(filler) + 1), f"The {key} is {value}.")
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"What is the {key}?"}],
                "context": " ".join(filler),
                "data_source": MEMORY_SOURCE,
                "reward_model": {"style": "rule", "ground_truth": value},
                "extra_info": {"split": split, "index": index},
            }
        )
    return rows


TASKS = {"copy": make_rows, "memory": make_memory_rows}


def write(
    out: str | Path,
    train: int = 32,
    val: int = 8,
    seed: int = 0,
    task: str = "copy",
    sentences: tuple[int, int] | None = None,
) -> dict[str, Path]:
    """Write ``train.parquet`` and ``val.parquet`` (+ ``dev.parquet``, a copy) under ``out``; returns the paths.
    ``sentences`` (memory task only): the (min, max) filler sentences of a document."""
    import pandas as pd

    if sentences is not None and task != "memory":
        raise ValueError("sentences sets the document length of the memory task only")
    kwargs = {} if sentences is None else {"sentences": sentences}

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, count in (("train", train), ("val", val)):
        path = out / f"{split}.parquet"
        pd.DataFrame(TASKS[task](count, split, seed, **kwargs)).to_parquet(path)
        paths[split] = path
    paths["dev"] = out / "dev.parquet"
    paths["dev"].write_bytes(paths["val"].read_bytes())
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--task", choices=sorted(TASKS), default="copy")
    parser.add_argument("--train", type=int, default=32)
    parser.add_argument("--val", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sentences", type=int, nargs=2, metavar=("MIN", "MAX"), help="memory: document length")
    args = parser.parse_args(argv)
    sentences = tuple(args.sentences) if args.sentences else None
    for split, path in write(args.out, args.train, args.val, args.seed, args.task, sentences).items():
        print(f"{split}: {path}")


if __name__ == "__main__":
    main()
