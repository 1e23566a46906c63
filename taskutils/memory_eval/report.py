"""Summarize a results folder: ``summary.md``, ``summary.csv``, ``accuracy_vs_length.png`` (sub_em) and
``strict_vs_length.png``.

    python -m taskutils.memory_eval.report RESULTS_DIR [--data-dir DATA_DIR] [--out DIR]

One row per results file (model, method, task, length). Accuracies are percentages over *every* item of the file,
failed ones counting 0 (the original left them out): n is the number of items with a line, ``failed`` how many of them
failed. A file with fewer lines than its eval set is flagged (the run is incomplete or was limited). ``sub_em``
(lenient, "the answer is" extraction, or the boxed content for -boxed methods) is the paper's headline; ``strict`` is
the training verifier (a boxed answer in the last 300 characters), which answers in the "the answer is" format
never satisfy, so it is ~0 for the memory and direct methods by design (docs/fidelity.md, "Evaluation: the paper's
protocol").

The plot follows the paper's main figure: accuracy vs context length (log scale), one line per model and method,
one panel per task family (HotpotQA; RULER niah_*, vt, fwe, cwe, qa_* averaged over the family's tasks).

``table2.md`` (written when there are HotpotQA results; ``--table2`` also prints it) is RULER-HotpotQA in the layout
of the paper's Table 2: one row per model, one column per context length (7K ... 3.5M tokens), sub_em in %, with
the paper's two RL-MemAgent rows underneath for comparison.

``benchmarks.md`` (written when there are LongBench-QA or BABILong results) puts them in the same layout: LongBench-QA a
row per model, a column per subset and the average (the paper's LongBench-QA column, with the paper's three rows as a
secondary source reports them), BABILong a row per model and task, a column per config; every cell the benchmark's own
metric (LongBench F1, BABILong accuracy), then the lenient sub_em and the strict score, in %.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from recurrent.resume import read_jsonl
from taskutils.memory_eval import config as cfg
from taskutils.memory_eval import evalsets, results
from taskutils.memory_eval.lengths import HOTPOTQA_TOKENS, column_label, context_tokens, family, length_label
from taskutils.memory_eval.report_benchmarks import benchmarks_table

# The paper's Table 2 (RULER-HotpotQA accuracy in %, at the document counts of HOTPOTQA_TOKENS, in order): the rows
# of the two released memory agents, which a training run of configs/memagent_{7b,14b}.yaml reproduces.
PAPER_TABLE2 = {
    "RL-MemAgent-14B (paper)": (83.59, 82.03, 84.38, 80.47, 76.56, 81.25, 75.00, 77.34, 76.56, 78.12),
    "RL-MemAgent-7B (paper)": (82.03, 79.69, 78.91, 77.34, 79.69, 72.66, 74.22, 76.56, 75.78, 71.09),
}
TASK_ORDER = (cfg.HOTPOTQA, *cfg.RULER_TASKS, *cfg.RULER_EXTRA_TASKS, cfg.NEEDLE, *cfg.LONGBENCH_QA, *cfg.BABILONG_QA)
METRIC_COLUMNS = ("strict", "sub_em", "em", "f1", "bench")


@dataclass
class Row:
    model: str
    method: str
    task: str
    length: int
    n: int
    expected: int | None
    failed: int
    no_answer: int  # answered, but nothing could be extracted ("the answer is" or a box): a format failure
    strict: float | None
    sub_em: float | None
    em: float | None
    f1: float | None
    bench: float | None  # the benchmark's own metric (LongBench F1, BABILong accuracy); None for the other tasks
    prompt_tokens: int
    completion_tokens: int
    seconds_per_item: float | None

    @property
    def incomplete(self) -> bool:
        return self.expected is not None and self.n < self.expected


def _mean_pct(records: list[dict[str, Any]], key: str) -> float | None:
    values = [r.get(key) for r in records]
    if not records or all(v is None for v in values):
        return None  # the metric does not apply to this task (em / f1 on RULER non-QA tasks)
    return round(100 * sum(v or 0 for v in values) / len(records), 2)


def _expected(path: Path, meta: dict[str, Any], data_dir: Path | None, task: str, length: int) -> int | None:
    if "expected" in meta:
        return int(meta["expected"])
    if data_dir is not None:
        data = evalsets.data_file(data_dir, task, length)
        if data is not None:
            return evalsets.item_count(data)
    return None


def _split_dir(name: str) -> tuple[str, int] | None:
    match = re.fullmatch(r"(.+)_(\d+)", name)
    return (match.group(1), int(match.group(2))) if match else None


def results_files(results_dir: str | Path) -> Iterator[tuple[Path, str, int]]:
    """``(path, task, length)`` of every ``<task>_<length>/<model>__<method>.jsonl`` under ``results_dir``."""
    for path in sorted(Path(results_dir).glob("*/*.jsonl")):
        parsed = _split_dir(path.parent.name)
        if parsed is not None and "__" in path.stem:
            yield path, *parsed


def collect(results_dir: str | Path, data_dir: str | Path | None = None) -> list[Row]:
    """One row per results file under ``results_dir``."""
    rows = []
    data_dir = Path(data_dir) if data_dir else None
    for path, task, length in results_files(results_dir):
        records = list({r["id"]: r for r in read_jsonl(path)}.values())  # last line per id
        meta = results.read_meta(path)
        model = (records[0]["model"] if records else None) or meta.get("model") or path.stem.rsplit("__", 1)[0]
        method = path.stem.rsplit("__", 1)[1]
        seconds = [r.get("seconds", 0.0) for r in records]
        rows.append(
            Row(
                model=model,
                method=method,
                task=task,
                length=length,
                n=len(records),
                expected=_expected(path, meta, data_dir, task, length),
                failed=sum(bool(r.get("error")) for r in records),
                no_answer=sum(not r.get("error") and not r.get("pred") for r in records),
                strict=_mean_pct(records, "strict"),
                sub_em=_mean_pct(records, "sub_em"),
                em=_mean_pct(records, "em"),
                f1=_mean_pct(records, "f1"),
                bench=_mean_pct(records, "bench"),
                prompt_tokens=sum(r.get("prompt_tokens", 0) for r in records),
                completion_tokens=sum(r.get("completion_tokens", 0) for r in records),
                seconds_per_item=round(sum(seconds) / len(seconds), 3) if seconds else None,
            )
        )
    order = {t: i for i, t in enumerate(TASK_ORDER)}
    rows.sort(key=lambda r: (order.get(r.task, len(order)), r.task, r.model, r.method, r.length))
    return rows


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,d}" if value >= 10_000 else str(value)
    return str(value)


def write_csv(rows: list[Row], path: Path) -> None:
    names = [f.name for f in fields(Row)]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(names)
        for row in rows:
            writer.writerow(["" if getattr(row, n) is None else getattr(row, n) for n in names])


def _mark(row: Row) -> str:
    return "*" if row.incomplete or row.failed else ""


def markdown(rows: list[Row]) -> str:
    lines = ["# Evaluation summary", ""]
    lines += [
        "Accuracies in %, over every item of a file (failed items count 0). `sub_em`: lenient, the paper's "
        "headline. `strict`: the training verifier (boxed answer); ~0 for the `memory` and `direct` methods, "
        "whose 'the answer is' format has no box. `em`/`f1` do not apply to RULER non-QA tasks. "
        "`no answer`: items answered without an extractable answer (no 'the answer is', no box): they score 0 "
        "for their format, not for their content. `bench`: the benchmark's own metric of the whole answer "
        "(LongBench-QA token F1, BABILong accuracy), for those benchmarks only.",
        "",
    ]
    by_task: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_task[row.task].append(row)
    for task, task_rows in by_task.items():
        lengths = sorted({r.length for r in task_rows})
        unit = {cfg.HOTPOTQA: " (documents)", cfg.NEEDLE: " (chunks of 64 tokens)"}.get(task, "")
        lines += [f"## {task}: sub_em by length{unit}", ""]
        header = ["model", "method", *(column_label(task, n) for n in lengths)]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        cells: dict[tuple[str, str], dict[int, Row]] = defaultdict(dict)
        for r in task_rows:
            cells[(r.model, r.method)][r.length] = r
        for (model, method), by_len in cells.items():
            values = []
            for n in lengths:
                r = by_len.get(n)
                values.append("" if r is None else _fmt(r.sub_em) + _mark(r))
            lines.append("| " + " | ".join([model, method, *values]) + " |")
        lines.append("")
    lines += ["`*`: incomplete file or failed items (see below).", "", "## All files", ""]
    header = [
        "model",
        "method",
        "task",
        "length",
        "n",
        "expected",
        "failed",
        "no answer",
        *METRIC_COLUMNS,
        "prompt tokens",
        "completion tokens",
        "s/item",
    ]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        values = [
            r.model,
            r.method,
            r.task,
            r.length,
            r.n,
            r.expected,
            r.failed,
            r.no_answer,
            r.strict,
            r.sub_em,
            r.em,
            r.f1,
            r.bench,
            r.prompt_tokens,
            r.completion_tokens,
            r.seconds_per_item,
        ]
        lines.append("| " + " | ".join(_fmt(v) for v in values) + " |")
    total_p = sum(r.prompt_tokens for r in rows)
    total_c = sum(r.completion_tokens for r in rows)
    lines += ["", f"Tokens over all files: {total_p:,d} prompt + {total_c:,d} completion.", ""]
    warnings = warn_lines(rows)
    if warnings:
        lines += ["## Warnings", "", *(f"- {w}" for w in warnings), ""]
    return "\n".join(lines)


def table2(rows: list[Row]) -> str | None:
    """RULER-HotpotQA in the layout of the paper's Table 2: a row per model (``model (method)`` when a model was run
    with several methods), a column per length run, sub_em in %; the paper's RL-MemAgent rows at the paper's
    lengths. None when there are no HotpotQA results."""
    hotpotqa = [r for r in rows if r.task == cfg.HOTPOTQA]
    if not hotpotqa:
        return None
    lengths = sorted({r.length for r in hotpotqa})
    methods: dict[str, set[str]] = defaultdict(set)
    cells: dict[tuple[str, str], dict[int, Row]] = defaultdict(dict)
    for r in hotpotqa:
        methods[r.model].add(r.method)
        cells[(r.model, r.method)][r.length] = r
    header = ["Model", *(length_label(HOTPOTQA_TOKENS[n]) if n in HOTPOTQA_TOKENS else f"{n} docs" for n in lengths)]
    lines = [
        "# RULER-HotpotQA accuracy (%) by context length",
        "",
        "The layout of the paper's Table 2: sub_em over every item of a file (failed items count 0); `*`: an "
        "incomplete file or failed items (summary.md says which); N/A: not run. The paper's rows are its own numbers.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for (model, method), by_length in cells.items():
        label = model if len(methods[model]) == 1 else f"{model} ({method})"
        values = [_fmt(by_length[n].sub_em) + _mark(by_length[n]) if n in by_length else "N/A" for n in lengths]
        lines.append("| " + " | ".join([label, *values]) + " |")
    paper_columns = {n: i for i, n in enumerate(HOTPOTQA_TOKENS)}
    if any(n in paper_columns for n in lengths):
        for name, values in PAPER_TABLE2.items():
            row = [f"{values[paper_columns[n]]:.2f}" if n in paper_columns else "" for n in lengths]
            lines.append("| " + " | ".join([name, *row]) + " |")
    return "\n".join([*lines, ""])


def warn_lines(rows: list[Row]) -> list[str]:
    out = []
    for r in rows:
        where = f"{r.task}_{r.length}/{r.model}__{r.method}"
        if r.incomplete:
            out.append(f"{where}: {r.n} lines, eval set has {r.expected} (incomplete run or --limit)")
        if r.failed:
            out.append(f"{where}: {r.failed} of {r.n} items failed (counted as 0; rerun with --retry-failed)")
        if r.no_answer:
            out.append(f"{where}: {r.no_answer} of {r.n} answers had no extractable answer (counted as 0)")
    return out


PLOTS = {"sub_em": "accuracy_vs_length.png", "strict": "strict_vs_length.png"}


def plot(rows: list[Row], path: Path, metric: str = "sub_em") -> list[tuple[str, str]]:
    """``metric`` (%) vs context length (log x), one line per model+method, one panel per task family. Returns
    each panel's (title, y label), the names a reader sees."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    # family -> (model, method) -> tokens -> [sub_em of each task of the family]
    series: dict[str, dict[tuple[str, str], dict[int, list[float]]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        value = getattr(r, metric)
        if value is None or context_tokens(r.task, r.length) <= 0:  # a log axis has no 0 (BABILong 0k, LongBench)
            continue
        series[family(r.task)][(r.model, r.method)].setdefault(context_tokens(r.task, r.length), []).append(value)
    families = sorted(series, key=lambda f: (f != cfg.HOTPOTQA, f))
    if not families:
        families = [cfg.HOTPOTQA]
    cols = min(3, len(families))
    nrows = math.ceil(len(families) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6 * cols, 4.2 * nrows), squeeze=False)
    for ax, fam in zip(axes.flat, families, strict=False):
        for (model, method), points in sorted(series[fam].items()):
            xs = sorted(points)
            ys = [sum(points[x]) / len(points[x]) for x in xs]
            ax.plot(xs, ys, marker="o", label=f"{model} ({method})")
        ax.set_xscale("log")
        ticks = sorted({x for pts in series[fam].values() for x in pts})
        if ticks:
            ax.set_xticks(ticks)
            ax.set_xticklabels([length_label(t) for t in ticks], rotation=45)
            ax.minorticks_off()
        ax.set_ylim(-2, 102)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel(f"{metric} (%)")
        names = {cfg.HOTPOTQA: "RULER-HotpotQA", cfg.NEEDLE: "needle (CPU replication)", "babilong": "BABILong"}
        title = names.get(fam, f"RULER {fam}")
        ax.set_title(f"{title}: {metric}")
        ax.grid(True, alpha=0.3)
        if series[fam]:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(families) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return [(ax.get_title(), ax.get_ylabel()) for ax in list(axes.flat)[: len(families)]]


def write_report(
    results_dir: str | Path, data_dir: str | Path | None = None, out_dir: str | Path | None = None
) -> list[Path]:
    """Write the summary files (``table2.md`` only when there are HotpotQA results); returns their paths.
    Incomplete files are reported on stderr too."""
    results_dir = Path(results_dir)
    out_dir = Path(out_dir) if out_dir else results_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = collect(results_dir, data_dir)
    paths = [out_dir / "summary.md", out_dir / "summary.csv"]
    paths[0].write_text(markdown(rows))
    write_csv(rows, paths[1])
    for metric, name in PLOTS.items():
        paths.append(out_dir / name)
        plot(rows, paths[-1], metric)
    hotpotqa_table = table2(rows)
    if hotpotqa_table is not None:
        paths.append(out_dir / "table2.md")
        paths[-1].write_text(hotpotqa_table)
    benchmark_tables = benchmarks_table(rows)
    if benchmark_tables is not None:
        paths.append(out_dir / "benchmarks.md")
        paths[-1].write_text(benchmark_tables)
    for warning in warn_lines(rows):
        print(f"warning: {warning}", file=sys.stderr)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m taskutils.memory_eval.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("results_dir", type=Path, help="the --results-dir of the runs")
    parser.add_argument("--data-dir", type=Path, help="eval sets, to count items when a file has no metadata")
    parser.add_argument("--out", type=Path, help="where to write the summary (default: RESULTS_DIR)")
    parser.add_argument(
        "--table2", action="store_true", help="also print RULER-HotpotQA in the layout of the paper's Table 2"
    )
    args = parser.parse_args(argv)
    if not args.results_dir.is_dir():
        parser.error(f"{args.results_dir} is not a folder")
    try:
        if next(results_files(args.results_dir), None) is None:
            # An empty summary would look like a run that scored nothing: say what the folder lacks instead.
            parser.error(
                f"{args.results_dir} holds no results files (<task>_<length>/<model>__<method>.jsonl): is it the "
                "--results-dir of a run?"
            )
        written = write_report(args.results_dir, args.data_dir, args.out)
    except ValueError as err:  # a corrupt results line or .meta.json: the message names the file
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    if args.table2:
        tables = [path for path in written if path.name == "table2.md"]
        print(tables[0].read_text() if tables else "(no RULER-HotpotQA results: no Table 2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
