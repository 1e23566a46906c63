"""``benchmarks.md``: LongBench-QA and BABILong in the layout of the paper's Table 2, from the rows of
:func:`taskutils.memory_eval.report.collect`: LongBench-QA a row per model, a column per subset and their average,
the paper's three rows underneath; BABILong a row per model and task, a column per config. Every cell is the
benchmark's own metric, then the lenient sub_em and the strict score, in %."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from taskutils.memory_eval import config as cfg

# The ICLR version's LongBench-QA average (%), as a secondary source reports it; which subsets and metric it averaged
# is not known here (docs/third_party_eval.md, "LongBench-QA and BABILong").
PAPER_LONGBENCH_QA = {
    "MemAgent-14B (paper)": 51.0,
    "QwenLong-L1-32B (paper)": 50.7,
    "Qwen2.5-14B-Instruct (paper)": 42.0,
}


def _cell(rows: list[Any]) -> str:
    """``bench · sub_em · strict`` of one or more files (their mean), in %; ``*`` marks an incomplete one."""
    if not rows:
        return "N/A"
    means = [sum(getattr(r, m) or 0 for r in rows) / len(rows) for m in ("bench", "sub_em", "strict")]
    return " · ".join(f"{v:.2f}" for v in means) + ("*" if any(r.incomplete or r.failed for r in rows) else "")


def _label(model: str, method: str, methods: dict[str, set[str]]) -> str:
    return model if len(methods[model]) == 1 else f"{model} ({method})"


def benchmarks_table(rows: list[Any]) -> str | None:
    """LongBench-QA and BABILong in the layout of the paper's Table 2 (see the module docstring); None when there are
    no results of either."""
    longbench = [r for r in rows if r.task in cfg.LONGBENCH_QA]
    babilong = [r for r in rows if r.task in cfg.BABILONG_QA]
    if not longbench and not babilong:
        return None
    lines = [
        "# LongBench-QA and BABILong",
        "",
        "Every cell: the benchmark's own metric of the whole answer (LongBench: token F1, the best over the gold "
        "answers; BABILong: accuracy, the target in the answer) · the lenient sub_em · the strict score, in %, over "
        "every item of a file (failed items count 0); `*`: an incomplete file or failed items; N/A: not run.",
        "",
    ]
    methods: dict[str, set[str]] = defaultdict(set)
    for r in longbench + babilong:
        methods[r.model].add(r.method)
    if longbench:
        subsets = [t for t in cfg.LONGBENCH_QA if any(r.task == t for r in longbench)]
        header = ["Model", *(t.removeprefix("longbench_") for t in subsets), "LongBench-QA (average)"]
        lines += ["## LongBench-QA", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        cells: dict[tuple[str, str], dict[str, Any]] = defaultdict(dict)
        for r in longbench:
            cells[(r.model, r.method)][r.task] = r
        for (model, method), by_task in cells.items():
            values = [_cell([by_task[t]] if t in by_task else []) for t in subsets]
            average = _cell(list(by_task.values())) if len(by_task) == len(subsets) else "N/A"
            lines.append("| " + " | ".join([_label(model, method, methods), *values, average]) + " |")
        for name, value in PAPER_LONGBENCH_QA.items():
            lines.append("| " + " | ".join([name, *([""] * len(subsets)), f"{value:.1f}"]) + " |")
        lines.append("")
    if babilong:
        lengths = sorted({r.length for r in babilong})
        header = ["Model", "task", *(cfg.BABILONG_CONFIGS.get(n, f"{n}k") for n in lengths)]
        lines += ["## BABILong", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        by_row: dict[tuple[str, str, str], dict[int, Any]] = defaultdict(dict)
        for r in babilong:
            by_row[(r.model, r.method, r.task)][r.length] = r
        for (model, method, task), by_length in sorted(by_row.items()):
            values = [_cell([by_length[n]] if n in by_length else []) for n in lengths]
            lines.append(
                "| " + " | ".join([_label(model, method, methods), task.removeprefix("babilong_"), *values]) + " |"
            )
        lines.append("")
    return "\n".join(lines)
