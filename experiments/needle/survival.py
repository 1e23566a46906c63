"""Needle survival: how long each policy keeps the needle's number in memory once it has written it.

    python -m experiments.needle.survival RESULTS_DIR --data-dir EVAL_DIR [--out DIR] [--method memory-boxed]
        [--task needle]

reads the harness's per-item results written with ``--trace`` (``RESULTS_DIR/needle_<N>/<model>__<method>.jsonl``,
whose lines hold ``memories``: the memory after every chunk) and the eval sets they were run on
(``EVAL_DIR/eval_needle_<N>.jsonl``, whose items name the chunk holding the needle, ``needle_chunk``), and follows
the needle's number through each document's memories:

- ``written``: the first chunk, from the needle's own on, whose memory holds the number exactly (a run of digits
  equal to it); none: the needle was never written. Then ``write`` is how the needle's chunk's memory missed it;
- ``lost``: the first later chunk whose memory no longer holds it exactly, and how (:func:`memory_kind`):
  ``dropped`` (no number of 3 or more digits left: the needle sentence replaced by filler or words),
  ``miscopied`` (a number one digit off or a near copy of it, :func:`experiments.needle.misses.miss_kind`:
  the number drifted as the memory was rewritten) or ``replaced`` (another number);
- ``final_intact``: the last memory holds it (the answer turn reads only that);
- ``before``: what the memory held when the needle's chunk came (:func:`prior_kind`): a policy that writes a
  needle sentence with a made-up number over the filler must overwrite it there.

Every chunk read after ``written`` while the number is intact is one *keep decision*. Over a policy's documents
(every length, every seed), the survival curve S(k) = P(the number is still intact k chunks after it was written)
is the product-limit (Kaplan-Meier) estimate: at each k, of the documents still intact after k - 1 decisions
that have a k-th chunk to read, the share that keep it (documents that end earlier leave the count, they do not
count as kept or lost). The fitted per-chunk keep rate is 1 - losses / decisions, the constant rate that best
explains the losses (maximum likelihood for a geometric survival time); ``p ** k`` is its curve.

Writes into ``--out`` (default ``RESULTS_DIR``): ``survival.md`` (the table), ``survival.csv`` (S(k) per policy),
``survival_events.csv`` (one line per document: the facts above, all the table is computed from) and
``survival.png`` (S(k) against k, with the fitted ``p ** k`` dashed).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from experiments.needle.misses import miss_kind
from experiments.needle.policies import POLICY_NAMES, policy_name, policy_of_model
from recurrent.resume import read_jsonl
from taskutils.memory_eval.report import results_files

LOSS_KINDS = ("dropped", "miscopied", "replaced")
# The curve's points in the table: k chunks after the write (the longest evaluation, 256 chunks, allows 255; a
# point past a run's longest length is "–").
TABLE_K = (1, 3, 7, 15, 31, 63, 127, 255)
_NUMBER = re.compile(r"\d{3,}")
PRIOR_KINDS = ("first chunk", "no number", "part of a number", "a whole number")


def holds(memory: str, number: str) -> bool:
    """The memory holds the number exactly: a run of digits equal to it."""
    return number in re.findall(r"\d+", memory or "")


def memory_kind(memory: str, number: str) -> str:
    """``intact`` when the memory holds the number exactly, else how it lost it: ``miscopied`` (a number close to
    it: one digit off or a near copy), ``replaced`` (another number of 3+ digits), ``dropped`` (no such number)."""
    if holds(memory, number):
        return "intact"
    runs = _NUMBER.findall(memory or "")
    if any(miss_kind(run, number, False) in ("one digit off", "near copy") for run in runs):
        return "miscopied"
    return "replaced" if runs else "dropped"


def prior_kind(memories: list[str], needle_chunk: int, number: str) -> str:
    """What the memory held when the needle's chunk came (one of :data:`PRIOR_KINDS`): ``first chunk`` (the needle
    is in it: no memory written yet), ``no number`` (no digits), ``part of a number`` (digits, fewer than the
    needle has), ``a whole number`` (a run of as many digits as the needle or more: a number the policy made up
    before it read the needle, or, in the choosing task, another needle's)."""
    if needle_chunk == 0:
        return "first chunk"
    runs = re.findall(r"\d+", memories[needle_chunk - 1] or "")
    if not runs:
        return "no number"
    return "a whole number" if max(map(len, runs)) >= len(number) else "part of a number"


@dataclass(frozen=True)
class Event:
    """One document's needle through the memories of one model (chunks are 0-based)."""

    model: str
    method: str
    length: int
    id: str
    needle_chunk: int
    written: int | None  # the first chunk >= needle_chunk whose memory holds the number; None: never
    write: str  # "written", or how the needle chunk's memory missed it (memory_kind)
    lost: int | None  # the first chunk after ``written`` whose memory does not hold it; None: kept to the end
    loss: str  # the kind of that loss (LOSS_KINDS), "" when not lost
    final_intact: bool
    right: bool  # the answer was right (strict)
    before: str = ""  # what the memory held when the needle's chunk came (prior_kind); "" in older events files

    @property
    def decisions(self) -> int:
        """Keep decisions: chunks read after the write while the number was still intact (the lost one counts)."""
        if self.written is None:
            return 0
        end = self.lost if self.lost is not None else self.length - 1
        return end - self.written


def event(model: str, method: str, length: int, record: dict, needle_chunk: int) -> Event:
    """The event of one results line (with ``memories``) whose needle lies in ``needle_chunk``."""
    number = str(record["gold"][0])
    memories: list[str] = record["memories"]
    if len(memories) != length:
        raise ValueError(f"item {record['id']} of {model} at {length} chunks has {len(memories)} memories")
    if not 0 <= needle_chunk < length:
        raise ValueError(f"item {record['id']} at {length} chunks: needle_chunk {needle_chunk} is out of range")
    written = next((c for c in range(needle_chunk, length) if holds(memories[c], number)), None)
    lost = loss = None
    if written is not None:
        lost = next((c for c in range(written + 1, length) if not holds(memories[c], number)), None)
        loss = memory_kind(memories[lost], number) if lost is not None else None
    return Event(
        model=model,
        method=method,
        length=length,
        id=str(record["id"]),
        needle_chunk=needle_chunk,
        written=written,
        write="written" if written == needle_chunk else memory_kind(memories[needle_chunk], number),
        lost=lost,
        loss=loss or "",
        final_intact=holds(memories[-1], number),
        right=bool(record.get("strict")),
        before=prior_kind(memories, needle_chunk, number),
    )


def needle_chunks(data_dir: Path, length: int, task: str = "needle") -> dict[str, int]:
    """Item index -> the chunk holding its (asked) needle, from ``eval_<task>_<length>.jsonl``."""
    path = data_dir / f"eval_{task}_{length}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no eval set for the results at {length} chunks (--data-dir)")
    chunks = {}
    for line_no, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        item = json.loads(line)
        if "needle_chunk" not in item:
            raise ValueError(f"{path}:{line_no}: the item has no 'needle_chunk' (made by experiments.needle.needle)")
        chunks[str(item["index"])] = int(item["needle_chunk"])
    return chunks


def collect(
    results_dir: str | Path, data_dir: str | Path, method: str = "memory-boxed", task: str = "needle"
) -> list[Event]:
    """The events of every traced results file of ``task`` and ``method`` (failed items are left out: they have no
    memories). The choosing task's events follow the asked needle."""
    events = []
    for path, file_task, length in results_files(results_dir):
        if file_task != task or not path.stem.endswith(f"__{method}"):
            continue
        model = path.stem.rsplit("__", 1)[0]
        chunks = needle_chunks(Path(data_dir), length, task)
        records = [r for r in {r["id"]: r for r in read_jsonl(path)}.values() if not r.get("error")]
        if records and "memories" not in records[0]:
            raise ValueError(f"{path}: no 'memories' in its lines: run the harness with --trace")
        events += [event(model, method, length, r, chunks[str(r["id"])]) for r in records]
    return events


@dataclass
class Curve:
    """One policy's survival over every document it read."""

    policy: str
    documents: int
    written: int
    write_misses: dict[str, int]
    decisions: int
    losses: dict[str, int]
    at_risk: list[int]  # at_risk[k]: documents intact after k - 1 decisions with a k-th chunk to read (k >= 1)
    lost_at: list[int]  # lost_at[k]: of those, the ones lost at the k-th
    survival: list[float]  # survival[k] = S(k); survival[0] = 1

    @property
    def keep_rate(self) -> float | None:
        return None if not self.decisions else 1 - sum(self.losses.values()) / self.decisions


def curve(policy: str, events: list[Event]) -> Curve:
    """The product-limit survival curve and the counts of one policy's events."""
    written = [e for e in events if e.written is not None]
    longest = max((e.length - 1 - e.written for e in written), default=0)
    at_risk, lost_at, survival = [0] * (longest + 1), [0] * (longest + 1), [1.0]
    for e in written:
        for k in range(1, e.decisions + 1):
            at_risk[k] += 1
        if e.lost is not None:
            lost_at[e.lost - e.written] += 1
    for k in range(1, longest + 1):
        survival.append(survival[-1] * (1 - lost_at[k] / at_risk[k]) if at_risk[k] else survival[-1])
    return Curve(
        policy=policy,
        documents=len(events),
        written=len(written),
        write_misses={kind: sum(e.write == kind for e in events) for kind in ("dropped", "miscopied", "replaced")},
        decisions=sum(e.decisions for e in written),
        losses={kind: sum(e.loss == kind for e in written) for kind in LOSS_KINDS},
        at_risk=at_risk,
        lost_at=lost_at,
        survival=survival,
    )


def curves(events: Iterable[Event]) -> dict[str, Curve]:
    """One curve per policy (a model without its ``-seed<k>``, with its method), in the report's display order."""
    by_policy: dict[tuple[str, str], list[Event]] = defaultdict(list)
    for e in events:
        by_policy[policy_of_model(e.model, e.method)].append(e)
    order = list(POLICY_NAMES)
    keys = sorted(by_policy, key=lambda p: (order.index(p) if p in order else len(order), p))
    return {policy_name(p): curve(policy_name(p), by_policy[p]) for p in keys}


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def markdown(table: dict[str, Curve]) -> str:
    head = (
        "| policy | documents | written % | write missed: dropped / miscopied / replaced | keep decisions "
        "| lost: dropped / miscopied / replaced | keep rate per chunk % | "
        + " | ".join(f"S({k}) %" for k in TABLE_K)
        + " |"
    )
    lines = [head, "|---|---|---|---|---|---|---|" + "---|" * len(TABLE_K)]
    for c in table.values():
        s = [_pct(c.survival[k]) if k < len(c.survival) else "–" for k in TABLE_K]
        misses = " / ".join(str(c.write_misses[kind]) for kind in ("dropped", "miscopied", "replaced"))
        losses = " / ".join(str(c.losses[kind]) for kind in LOSS_KINDS)
        written = _pct(c.written / c.documents if c.documents else None)
        keep = "–" if c.keep_rate is None else f"{100 * c.keep_rate:.2f}"
        lines.append(
            f"| {c.policy} | {c.documents} | {written} | {misses} | {c.decisions} | {losses} | {keep} | "
            + " | ".join(s)
            + " |"
        )
    note = (
        "Written: the memory after the needle's chunk holds its number exactly. A keep decision: a chunk read "
        "after the write while the number was still intact. S(k): the share of written needles still intact k "
        "chunks after the write (product-limit estimate over every length). Keep rate: 1 - losses / decisions."
    )
    return "\n".join(lines) + "\n\n" + note + "\n"


def policy_cells(events: Iterable[Event], column: Callable[[Event], Any]) -> list[tuple[str, dict[Any, list[Event]]]]:
    """Each policy's events (a row of a table, in the report's display order) grouped by ``column``."""
    cells: dict[str, dict[Any, list[Event]]] = defaultdict(lambda: defaultdict(list))
    for e in events:
        cells[policy_name(policy_of_model(e.model, e.method))][column(e)].append(e)
    order = [policy_name(p) for p in POLICY_NAMES]
    names = sorted(cells, key=lambda n: (order.index(n) if n in order else len(order), n))
    return [(name, cells[name]) for name in names]


def by_length(events: Iterable[Event]) -> str:
    """Accuracy at each length taken apart: the share of documents whose needle was written, whose last memory
    still holds it, and whose answer was right (%), per policy (a row) and length (a column)."""
    events = list(events)
    lengths = sorted({e.length for e in events})
    lines = [
        "| policy | " + " | ".join(f"{n} chunks: written / kept / right" for n in lengths) + " |",
        "|---|" + "---|" * len(lengths),
    ]
    for name, cells in policy_cells(events, lambda e: e.length):
        cols = []
        for n in lengths:
            docs = cells.get(n, [])
            if not docs:
                cols.append("–")
                continue
            shares = [
                sum(e.written is not None for e in docs),
                sum(e.final_intact for e in docs),
                sum(e.right for e in docs),
            ]
            cols.append(" / ".join(f"{100 * x / len(docs):.0f}" for x in shares))
        lines.append(f"| {name} | " + " | ".join(cols) + " |")
    return "\n".join(lines) + "\n"


def by_prior(events: Iterable[Event]) -> str:
    """The needle's write taken apart by what the memory held when its chunk came (:func:`prior_kind`): per policy
    and kind, the documents, the share written at the needle's own chunk and the share answered right (%)."""
    lines = ["| policy | " + " | ".join(PRIOR_KINDS) + " |", "|---|" + "---|" * len(PRIOR_KINDS)]
    for name, cells in policy_cells(events, lambda e: e.before):
        cols = []
        for kind in PRIOR_KINDS:
            docs = cells.get(kind, [])
            written = sum(e.write == "written" for e in docs)
            right = sum(e.right for e in docs)
            cols.append(
                f"{len(docs)}: {100 * written / len(docs):.0f} / {100 * right / len(docs):.0f}" if docs else "–"
            )
        lines.append(f"| {name} | " + " | ".join(cols) + " |")
    return "\n".join(lines) + "\n"


def write_events(events: list[Event], path: Path) -> None:
    names = [f.name for f in fields(Event)]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(names)
        for e in events:
            row = asdict(e)
            writer.writerow(["" if row[n] is None else row[n] for n in names])


def read_events(path: Path) -> list[Event]:
    """The events of ``survival_events.csv`` (:func:`write_events`)."""

    def opt(value: str) -> int | None:
        return None if value == "" else int(value)

    with path.open() as f:
        return [
            Event(
                model=r["model"],
                method=r["method"],
                length=int(r["length"]),
                id=r["id"],
                needle_chunk=int(r["needle_chunk"]),
                written=opt(r["written"]),
                write=r["write"],
                lost=opt(r["lost"]),
                loss=r["loss"],
                final_intact=r["final_intact"] == "True",
                right=r["right"] == "True",
                before=r.get("before", ""),
            )
            for r in csv.DictReader(f)
        ]


def write_csv(table: dict[str, Curve], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["policy", "k", "at_risk", "lost", "survival", "fitted"])
        for c in table.values():
            for k, s in enumerate(c.survival):
                fitted = None if c.keep_rate is None else round(c.keep_rate**k, 4)
                writer.writerow(
                    [c.policy, k, c.at_risk[k] if k else "", c.lost_at[k] if k else "", round(s, 4), fitted]
                )


def plot(table: dict[str, Curve], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    for c in table.values():
        if c.written == 0:
            continue
        ks = list(range(len(c.survival)))
        (line,) = ax.step(ks, [100 * s for s in c.survival], where="post", label=f"{c.policy} (n={c.written})")
        if c.keep_rate is not None:
            ax.plot(ks, [100 * c.keep_rate**k for k in ks], "--", color=line.get_color(), alpha=0.5, linewidth=1)
    ax.set_xlabel("chunks read after the needle was written (k)")
    ax.set_ylabel("needle's number still intact, S(k) (%)")
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("needle survival (dashed: fitted keep rate ** k)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write(
    results_dir: str | Path,
    data_dir: str | Path,
    out: str | Path | None = None,
    method: str = "memory-boxed",
    task: str = "needle",
) -> dict[str, Path]:
    """Write ``survival.md``, ``survival.csv``, ``survival_events.csv`` and ``survival.png``; returns their paths."""
    events = collect(results_dir, data_dir, method, task)
    if not events:
        raise FileNotFoundError(f"no {task}_<N>/<model>__{method}.jsonl results under {results_dir}")
    out = Path(out) if out else Path(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = curves(events)
    paths = {
        "md": out / "survival.md",
        "csv": out / "survival.csv",
        "events": out / "survival_events.csv",
        "png": out / "survival.png",
    }
    paths["md"].write_text(
        markdown(table)
        + "\nBy length (% of documents): the needle written, still intact in the last memory (what the answer reads), "
        "the answer right.\n\n"
        + by_length(events)
        + "\nBy what the memory held when the needle's chunk came (documents: the needle written at its own chunk % / "
        "the answer right %).\n\n" + by_prior(events)
    )
    write_csv(table, paths["csv"])
    write_events(events, paths["events"])
    plot(table, paths["png"])
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.needle.survival",
        description=__doc__.split("\n\n")[0],
        epilog="Exit status: 0; 2 when there are no traced results, or an eval set or a trace is missing or wrong.",
    )
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("--data-dir", type=Path, required=True, help="the eval sets' folder (eval_<task>_<N>.jsonl)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: RESULTS_DIR)")
    parser.add_argument("--method", default="memory-boxed")
    parser.add_argument("--task", default="needle", help="needle, or choose (the choosing task: the asked needle)")
    args = parser.parse_args(argv)
    try:
        paths = write(args.results_dir, args.data_dir, args.out, args.method, args.task)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(paths["md"].read_text())
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
