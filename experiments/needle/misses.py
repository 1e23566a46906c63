"""How the replication's policies miss: each wrong answer of the memory agent, by how close it is to the needle.

    python -m experiments.needle.misses RESULTS_DIR [--task needle] [--method memory-boxed]

reads the harness's per-item results (``RESULTS_DIR/<task>_<N>/<model>__<method>.jsonl``, through
:func:`taskutils.memory_eval.report.results_files`, the last line per item) and prints, per model and for the
training lengths (1-4 chunks) and the longer ones apart, how many answers were right and how the others missed:

- ``no number``: the answer holds no number (nothing boxed, or words);
- ``one digit off``: as many digits as the needle, exactly one of them wrong (a digit miscopied);
- ``near copy``: otherwise, all but one of the needle's digits in order (a digit dropped, added or shifted: the
  number drifted as the memory was rewritten);
- ``other number``: the rest (a guess, or another number).

The first two kinds after ``no number`` are copy errors: the agent found the needle and kept a damaged copy of it.
They are what capped the ~1M reader with one token per digit (docs/replication_cpu_notebook.md, "Numbers a small reader
can copy"). A second table splits the same answers by the needle: digits all distinct, or a digit repeated (the
numbers a one-token-per-digit reader miscopies).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from pathlib import Path

from recurrent.resume import read_jsonl
from taskutils.memory_eval.report import results_files

KINDS = ("right", "no number", "one digit off", "near copy", "other number")
TRAINING_CHUNKS = 4


def common_in_order(a: str, b: str) -> int:
    """The length of the longest common subsequence of ``a`` and ``b``."""
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def miss_kind(pred: str | None, gold: str, right: bool) -> str:
    """The kind (one of :data:`KINDS`) of an answer ``pred`` to the needle ``gold``."""
    if right:
        return "right"
    pred = (pred or "").strip()
    if not pred.isdigit():
        return "no number"
    if len(pred) == len(gold) and sum(p != g for p, g in zip(pred, gold, strict=True)) == 1:
        return "one digit off"
    if common_in_order(pred, gold) >= len(gold) - 1:
        return "near copy"
    return "other number"


def repeats_a_digit(number: str) -> bool:
    """Whether a digit occurs twice or more in ``number`` (7445: yes; 7451: no)."""
    return len(set(number)) < len(number)


def length_group(length: int) -> str:
    return f"1-{TRAINING_CHUNKS} chunks" if length <= TRAINING_CHUNKS else f"{TRAINING_CHUNKS * 2}+ chunks"


def tally(
    results_dir: str | Path, task: str = "needle", method: str = "memory-boxed"
) -> dict[tuple[str, str], Counter]:
    """Counts of each kind by (model, lengths), lengths ``1-4 chunks`` or ``8+ chunks``."""
    counts: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for model, group, pred, gold, right in answers(results_dir, task, method):
        counts[(model, group)][miss_kind(pred, gold, right)] += 1
    return dict(sorted(counts.items()))


def answers(results_dir: str | Path, task: str, method: str) -> list[tuple[str, str, str | None, str, bool]]:
    """Every item's (model, lengths group, answer, needle, right), the last line per item of each results file."""
    out = []
    for path, file_task, length in results_files(results_dir):
        if file_task != task or not path.stem.endswith(f"__{method}"):
            continue
        model = path.stem.rsplit("__", 1)[0]
        for record in {r["id"]: r for r in read_jsonl(path)}.values():
            gold = str(record["gold"][0])
            out.append((model, length_group(length), record.get("pred"), gold, bool(record.get("strict"))))
    return out


def tally_by_digits(
    results_dir: str | Path, task: str = "needle", method: str = "memory-boxed"
) -> dict[tuple[str, str, bool], Counter]:
    """Counts of ``items``, ``right`` and ``copy errors`` by (model, lengths, the needle repeats a digit)."""
    counts: dict[tuple[str, str, bool], Counter] = defaultdict(Counter)
    for model, group, pred, gold, right in answers(results_dir, task, method):
        count = counts[(model, group, repeats_a_digit(gold))]
        kind = miss_kind(pred, gold, right)
        count["items"] += 1
        count["right"] += kind == "right"
        count["copy errors"] += kind in ("one digit off", "near copy")
    return dict(sorted(counts.items()))


def markdown(counts: dict[tuple[str, str], Counter]) -> str:
    lines = ["| model | lengths | items | " + " | ".join(KINDS) + " | copy errors, % of misses |"]
    lines.append("|---|---|---|" + "---|" * (len(KINDS) + 1))
    for (model, group), count in counts.items():
        items = sum(count.values())
        misses = items - count["right"]
        copy = count["one digit off"] + count["near copy"]
        share = f"{100 * copy / misses:.0f}" if misses else "–"
        lines.append(f"| {model} | {group} | {items} | " + " | ".join(str(count[k]) for k in KINDS) + f" | {share} |")
    return "\n".join(lines) + "\n"


def digits_markdown(counts: dict[tuple[str, str, bool], Counter]) -> str:
    """Right and copy errors for needles of distinct digits beside needles that repeat one."""
    lines = [
        "| model | lengths | distinct digits: items / right / copy errors "
        "| a digit repeated: items / right / copy errors |",
        "|---|---|---|---|",
    ]
    for model, group in sorted({(m, g) for m, g, _ in counts}):
        cells = []
        for repeated in (False, True):
            c = counts.get((model, group, repeated), Counter())
            cells.append(f"{c['items']} / {c['right']} / {c['copy errors']}")
        lines.append(f"| {model} | {group} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.needle.misses",
        description=__doc__.split("\n\n")[0],
        epilog="Exit status: 0, or 2 when the folder holds no results of the task and method.",
    )
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("--task", default="needle")
    parser.add_argument("--method", default="memory-boxed")
    args = parser.parse_args(argv)
    counts = tally(args.results_dir, args.task, args.method)
    if not counts:
        print(
            f"error: no {args.task}_<N>/<model>__{args.method}.jsonl results under {args.results_dir}", file=sys.stderr
        )
        return 2
    print(markdown(counts))
    print(digits_markdown(tally_by_digits(args.results_dir, args.task, args.method)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
