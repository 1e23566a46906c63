"""What RL wrote into memory, step by step: the choosing task's whole and asked needles in a run's rollout dumps.

    python -m experiments.needle.rollout_memories RUN_DIR [--out DIR]

reads ``RUN_DIR/rollout/{step}.jsonl`` (``trainer.rollout_data_dir``: every row the step trained, with verl's text
columns ``input``, the prompt as text, and ``output``, the reply; verl_ext/rows.py) and, per step, over the sampled
trajectories of that step:

- ``reward``: the mean score of the trajectories' answers (the sampled training reward);
- ``needle_memories``: the memory turns whose reply names a needle (mentions a magic number or holds a 4-digit
  number);
- ``whole``: the share of those that are exactly one needle of the trajectory's document (a needle sentence the
  trajectory's chunks showed, or its bare number), not a blend of several;
- ``asked``: the share of those that are the asked needle (the question's key with the answer's number);
- ``final_asked``: the share of trajectories whose last memory is the asked needle (what the answer turn reads);
- ``turns_before``, ``numbers_before``: the memory turns before the chunk that shows the asked needle's number, and
  how many of them wrote a 4-digit number (a needle made up before the needle came; with distractors, also another
  needle's number).

The needles of a trajectory are the needle sentences in the ``<section>`` of its memory turns (together its whole
document); the asked key is the question's. Writes ``DIR/memories.csv`` (one line per step) and ``memories.png``
(the four shares against the step), by default into ``RUN_DIR``. Exit status: 0; 2 when ``RUN_DIR`` holds no dump.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from experiments.needle.needle import NEEDLE, NEEDLE_RE, NUMBER_RE, names_a_needle
from recurrent.resume import read_jsonl

COLUMNS = (
    "step",
    "trajectories",
    "reward",
    "needle_memories",
    "whole",
    "asked",
    "final_asked",
    "turns_before",
    "numbers_before",
)
_ASKED_KEY = re.compile(r"special magic number for (\S+) mentioned in the provided text\?")
_SECTION = re.compile(r"<section>(.*?)</section>", re.S)


class DumpError(ValueError):
    """A run folder whose dumps cannot be read; the message names the file."""


def trajectory_shares(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One trajectory's rows (memory turns then the answer, any order: sorted by ``turn_index``) -> its answer's
    score, its needle-naming memories, how many are whole and how many the asked needle, and whether its last
    memory is the asked needle."""
    rows = sorted(rows, key=lambda r: int(r["turn_index"]))
    memories = [r for r in rows if r["turn_kind"] == "memory"]
    final = [r for r in rows if r["turn_kind"] != "memory"]
    if len(final) != 1:
        raise DumpError(f"trajectory {rows[0]['trajectory']}: {len(final)} answer rows, expected 1")
    found = _ASKED_KEY.search(final[0]["input"])
    if not found:
        raise DumpError(f"trajectory {rows[0]['trajectory']}: no question 'special magic number for <key>' in it")
    gold = str(final[0]["gts"])
    pairs = {m.groups() for r in memories for s in _SECTION.findall(r["input"]) for m in NEEDLE_RE.finditer(s)}
    needles = {NEEDLE.format(key=k, value=v) for k, v in pairs} | {v for _, v in pairs}
    asked = {NEEDLE.format(key=found.group(1), value=gold), gold}
    written = [r["output"].strip() for r in memories]
    naming = [m for m in written if names_a_needle(m)]
    shown = [gold in "".join(_SECTION.findall(r["input"])) for r in memories]
    before = written[: shown.index(True)] if True in shown else written
    return {
        "score": float(final[0]["score"]),
        "naming": len(naming),
        "whole": sum(m in needles for m in naming),
        "asked": sum(m in asked for m in naming),
        "final_asked": bool(written) and written[-1] in asked,
        "turns_before": len(before),
        "numbers_before": sum(bool(NUMBER_RE.search(m)) for m in before),
    }


def step_row(step: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The step's line of ``memories.csv`` from its dump's rows (verl's padding rows left out)."""
    by_trajectory: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if str(row.get("is_padding")) != "True":
            by_trajectory[row["trajectory"]].append(row)
    shares = [trajectory_shares(r) for r in by_trajectory.values()]
    naming = sum(s["naming"] for s in shares)
    share = (lambda k: round(k / naming, 4)) if naming else (lambda k: 0.0)
    count = len(shares)
    return {
        "step": step,
        "trajectories": count,
        "reward": round(sum(s["score"] for s in shares) / count, 4) if count else 0.0,
        "needle_memories": naming,
        "whole": share(sum(s["whole"] for s in shares)),
        "asked": share(sum(s["asked"] for s in shares)),
        "final_asked": round(sum(s["final_asked"] for s in shares) / count, 4) if count else 0.0,
        "turns_before": sum(s["turns_before"] for s in shares),
        "numbers_before": sum(s["numbers_before"] for s in shares),
    }


def run_table(run_dir: Path) -> list[dict[str, Any]]:
    """Every dumped step's line, in step order."""
    dumps = sorted((int(p.stem), p) for p in (run_dir / "rollout").glob("*.jsonl") if p.stem.isdigit())
    if not dumps:
        raise DumpError(f"{run_dir / 'rollout'}: no {{step}}.jsonl dump (trainer.rollout_data_dir writes them)")
    table = []
    for step, path in dumps:
        try:
            table.append(step_row(step, list(read_jsonl(path))))
        except (KeyError, ValueError) as err:
            raise DumpError(f"{path}: {err}") from err
    return table


def write(table: list[dict[str, Any]], out: Path, title: str) -> None:
    """``memories.csv`` and ``memories.png`` into ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "memories.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(table)
    steps = [r["step"] for r in table]
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = {
        "reward": "sampled reward",
        "whole": "whole needle (of needle memories)",
        "asked": "asked needle (of needle memories)",
        "final_asked": "last memory is the asked needle",
    }
    for column, label in labels.items():
        ax.plot(steps, [r[column] for r in table], marker=".", label=label)
    ax.set(xlabel="RL step", ylabel="share", ylim=(0, 1), title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "memories.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.needle.rollout_memories",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", type=Path, help="an RL run's folder (holding rollout/{step}.jsonl)")
    parser.add_argument("--out", type=Path, help="where memories.csv and .png go (default: RUN_DIR)")
    args = parser.parse_args(argv)
    try:
        table = run_table(args.run_dir)
    except DumpError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    write(table, args.out or args.run_dir, f"memories RL wrote: {args.run_dir.name}")
    last = table[-1]
    print(
        f"{len(table)} steps; step {last['step']}: reward {last['reward']}, whole {last['whole']}, "
        f"asked {last['asked']}, last memory asked {last['final_asked']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
