"""The replication's table and figure: accuracy by document length x policy (the paper's Table 2 in miniature).

    python -m experiments.needle.report RESULTS_DIR [--out DIR] [--task needle] [--run-dir OUT_DIR]

reads the evaluation harness's results files (``RESULTS_DIR/needle_{N}/<model>__<method>.jsonl``, through
:func:`taskutils.memory_eval.report.collect`, the harness's own reader) and writes into ``--out`` (default
``RESULTS_DIR``):

- ``replication.md``: strict and lenient (``sub_em``) accuracy in %, one row per policy, one column per length;
- ``replication.csv``: the same numbers, one line per (policy, model, method, length), the seeds' own rows included;
- ``replication.png``: strict accuracy against document length (log scale), one line per policy.

With ``--eval-data`` (the eval sets' folder) and results written with the harness's ``--trace``, it also writes the
needle's survival in memory (:mod:`experiments.needle.survival`: ``survival.md``, ``.csv``, ``.png``,
``survival_events.csv``) and puts its table in ``replication.md``.

With ``--run-dir`` (the folder of ``scripts/replicate_cpu.sh``), ``replication.md`` ends with what ran: each
invocation's commit, command line and cores (``run.jsonl``), every stage's wall time (``timing.jsonl``), and the
run's wall time with and without the warm start's one-time build.

A policy is a model name without its ``-seed<k>`` suffix, with its method: ``rl-seed0`` and ``rl-seed1`` (memory
agent) are the policy ``rl``, reported as the mean of the seeds; a ``direct-boxed`` file is that model's
full-context baseline. Lengths are chunk counts of 64 tokens. A results file with fewer items than its eval set,
or with failed items, is flagged in the table (``*``) and makes :func:`main` exit with 1.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from experiments.needle.policies import POLICY_NAMES, policy_name, policy_of_model
from taskutils.memory_eval.report import Row, collect

TASK = "needle"
CHUNK_TOKENS = 64


@dataclass
class Cell:
    """One policy at one length: the mean over its seeds of each seed's mean score (in %)."""

    policy: tuple[str, str]
    length: int
    seeds: dict[str, Row]

    def mean(self, metric: str) -> float | None:
        values = [getattr(row, metric) for row in self.seeds.values()]
        if not values or any(v is None for v in values):
            return None
        return round(sum(values) / len(values), 2)

    @property
    def complete(self) -> bool:
        return all(not row.incomplete and not row.failed for row in self.seeds.values())


def policy_of(row: Row) -> tuple[str, str]:
    return policy_of_model(row.model, row.method)


def cells(rows: list[Row], task: str = TASK) -> dict[tuple[str, str], dict[int, Cell]]:
    """Cells by policy (in display order) and length."""
    table: dict[tuple[str, str], dict[int, Cell]] = defaultdict(dict)
    for row in rows:
        if row.task != task:
            continue
        policy = policy_of(row)
        cell = table[policy].setdefault(row.length, Cell(policy, row.length, {}))
        cell.seeds[row.model] = row
    order = list(POLICY_NAMES)
    return dict(sorted(table.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])))


def _fmt(cell: Cell | None, metric: str) -> str:
    if cell is None:
        return "–"
    value = cell.mean(metric)
    text = "–" if value is None else f"{value:.1f}"
    return text if cell.complete else text + "*"


def markdown(table: dict[tuple[str, str], dict[int, Cell]]) -> str:
    lengths = sorted({n for by_length in table.values() for n in by_length})
    header = "| policy | seeds | " + " | ".join(f"{n} ({n * CHUNK_TOKENS} tok)" for n in lengths) + " |"
    rule = "|---|---|" + "---|" * len(lengths)
    parts = []
    for metric, title in (("strict", "Strict accuracy (%)"), ("sub_em", "Lenient accuracy, sub_em (%)")):
        lines = [f"**{title}** by document length in chunks (tokens)", "", header, rule]
        for policy, by_length in table.items():
            seeds = sorted({m for cell in by_length.values() for m in cell.seeds})
            cols = " | ".join(_fmt(by_length.get(n), metric) for n in lengths)
            lines.append(f"| {policy_name(policy)} | {len(seeds)} | {cols} |")
        parts.append("\n".join(lines))
    note = (
        "A value is the mean over the policy's seeds (column `seeds`) of each seed's accuracy. "
        "`*`: incomplete (fewer items than the eval set, or failed items: they count as wrong)."
    )
    return "\n\n".join(parts) + "\n\n" + note + "\n"


def write_csv(table: dict[tuple[str, str], dict[int, Cell]], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["policy", "model", "method", "length", "items", "strict", "sub_em"])
        for policy, by_length in table.items():
            for n, cell in sorted(by_length.items()):
                for model, row in sorted(cell.seeds.items()):
                    writer.writerow([policy_name(policy), model, row.method, n, row.n, row.strict, row.sub_em])
                if len(cell.seeds) > 1:
                    writer.writerow(
                        [policy_name(policy), "mean", policy[1], n, "", cell.mean("strict"), cell.mean("sub_em")]
                    )


def plot(table: dict[tuple[str, str], dict[int, Cell]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.6, 4.0), dpi=100)
    for policy, by_length in table.items():
        points = [(n, cell.mean("strict")) for n, cell in sorted(by_length.items())]
        points = [(n, v) for n, v in points if v is not None]
        if points:
            style = "--" if policy[1].startswith("direct") else "-"
            ax.plot([n for n, _ in points], [v for _, v in points], style, marker="o", label=policy_name(policy))
    ax.set_xscale("log", base=2)
    lengths = sorted({n for by_length in table.values() for n in by_length})
    ax.set_xticks(lengths, [f"{n}\n{n * CHUNK_TOKENS}" for n in lengths])
    ax.set_xlabel("document length: chunks / tokens (training: 1-4 chunks)")
    ax.set_ylabel("strict accuracy (%)")
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: no curve hidden
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def invocation_stages(stages: list[dict]) -> list[list[dict]]:
    """timing.jsonl's lines, one list per invocation of the script: an invocation ends with its "total" line, and
    one that has none (stopped before the pipeline recorded stopped stages) ends where the next one's warm start
    stage begins (every invocation runs it: a cached build takes seconds)."""
    groups: list[list[dict]] = []
    for stage in stages:
        if not groups or groups[-1][-1]["stage"] == "total" or stage["stage"] == "warm_start":
            groups.append([])
        groups[-1].append(stage)
    return groups


def run_section(run_dir: Path) -> str:
    """What ran, from the script's ``run.jsonl`` and ``timing.jsonl``: one line per invocation (a resumed run has
    several), one row per stage run, and the wall time. ``total`` lines are an invocation's stages 1-5."""
    invocations, stages = _jsonl(run_dir / "run.jsonl"), _jsonl(run_dir / "timing.jsonl")
    lines = ["**The run**", ""]
    for inv in invocations:
        on = f"{inv['cores']} cores" + (f" of {inv['processor']}" if inv.get("processor") else "")  # older runs: cores
        lines.append(f"- {inv['started']}, commit `{inv['commit']}`, {on}: `{inv['command']}`")
    lines += ["", "| stage | wall (s) | wall (min) | exit |", "|---|---|---|---|"]
    lines += [f"| {s['stage']} | {s['seconds']} | {s['seconds'] / 60:.1f} | {s['rc']} |" for s in stages]
    if any(s["stage"] == "rl_runs" for s in stages):
        lines += [
            "",
            "The `rl:` stages ran side by side within `rl_runs` (`RL_PARALLEL` at a time): their times overlap, and "
            "`rl_runs` is their wall time.",
        ]
    groups = invocation_stages(stages)
    ended = [group for group in groups if group[-1]["stage"] == "total"]
    stopped = [group for group in groups if group[-1]["stage"] != "total"]
    total = sum(group[-1]["seconds"] for group in ended)
    build = sum(s["seconds"] for group in ended for s in group if s["stage"] == "warm_start")
    if total:
        lines += [
            "",
            f"Wall time, stages 1-5 of every invocation: {total} s ({total / 60:.1f} min); without the warm "
            f"start stage (its one-time build, cached afterwards): {total - build} s ({(total - build) / 60:.1f} min).",
        ]
    if stopped:
        recorded = sum(s["seconds"] for group in stopped for s in group)
        lines += [
            "",
            f"Not in that wall time: {len(stopped)} invocation(s) with no total line (stopped before the pipeline "
            f"recorded stopped stages), whose recorded stages took {recorded} s ({recorded / 60:.1f} min); the "
            "stage each was stopped in is not in the table.",
        ]
    return "\n".join(lines) + "\n"


def write(
    results_dir: str | Path,
    out: str | Path | None = None,
    task: str = TASK,
    run_dir: str | Path | None = None,
    eval_data: str | Path | None = None,
) -> dict[str, Path]:
    """Write the table (markdown, CSV) and the plot; returns their paths. With ``eval_data``, also the needle's
    survival (:func:`experiments.needle.survival.write`), its table in the markdown; with ``run_dir``, the
    markdown ends with :func:`run_section`."""
    from experiments.needle import survival

    results_dir = Path(results_dir)
    out = Path(out) if out else results_dir
    out.mkdir(parents=True, exist_ok=True)
    table = cells(collect(results_dir), task)
    if not table:
        raise FileNotFoundError(f"no {task}_<length>/<model>__<method>.jsonl results under {results_dir}")
    paths = {"md": out / "replication.md", "csv": out / "replication.csv", "png": out / "replication.png"}
    text = markdown(table)
    if eval_data:
        survival_paths = survival.write(results_dir, eval_data, out, task=task)
        paths |= {f"survival_{kind}": path for kind, path in survival_paths.items()}
        text += "\n**The needle in memory** (survival.md, survival.png)\n\n" + survival_paths["md"].read_text()
    paths["md"].write_text(text + ("\n" + run_section(Path(run_dir)) if run_dir else ""))
    write_csv(table, paths["csv"])
    plot(table, paths["png"])
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.needle.report",
        description=__doc__.split("\n\n")[0],
        epilog="Exit status: 0 when every results file is complete, 1 when one is not, 2 when there are none (or, with "
        "--eval-data, the survival's eval sets or traces are missing).",
    )
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: RESULTS_DIR)")
    parser.add_argument("--task", default=TASK)
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="the replication's folder: end the table with its run.jsonl and timing.jsonl",
    )
    parser.add_argument(
        "--eval-data",
        type=Path,
        default=None,
        help="the eval sets' folder (eval_<task>_<N>.jsonl): add the needle's survival (traced results)",
    )
    args = parser.parse_args(argv)
    try:
        paths = write(args.results_dir, args.out, args.task, args.run_dir, args.eval_data)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(paths["md"].read_text())
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    table = cells(collect(args.results_dir), args.task)
    return 0 if all(c.complete for by_length in table.values() for c in by_length.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
