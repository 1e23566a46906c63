"""benchmarks.md from results files written here by hand: LongBench-QA by subset and its average, BABILong by task and
config, every cell the benchmark's metric, sub_em and strict (means worked by hand)."""

from __future__ import annotations

import json
from pathlib import Path

from taskutils.memory_eval import report


def write_results(folder: Path, task: str, length: int, records: list[dict]) -> None:
    path = folder / f"{task}_{length}" / "m__memory.jsonl"
    path.parent.mkdir(parents=True)
    lines = [
        {"id": k, "model": "m", "pred": "x", "strict": 0.0, "em": 0.0, "f1": 0.0, **r} for k, r in enumerate(records)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_benchmarks_table_by_hand(tmp_path):
    write_results(tmp_path, "longbench_hotpotqa", 0, [{"bench": 1.0, "sub_em": 1.0}, {"bench": 0.5, "sub_em": 0.0}])
    write_results(tmp_path, "longbench_musique", 0, [{"bench": 0.25, "sub_em": 0.0}, {"bench": 0.25, "sub_em": 1.0}])
    write_results(tmp_path, "babilong_qa1", 0, [{"bench": 1.0, "sub_em": 1.0}, {"bench": 0.0, "sub_em": 0.0}])
    write_results(tmp_path, "babilong_qa1", 1000, [{"bench": 0.0, "sub_em": 0.0}, {"bench": 0.0, "sub_em": 0.0}])
    paths = report.write_report(tmp_path)
    text = (tmp_path / "benchmarks.md").read_text()
    assert tmp_path / "benchmarks.md" in paths
    # hotpotqa: bench (100 + 50) / 2 = 75, sub_em 50; musique: 25, 50; the average of the two files: 50, 50
    assert "| Model | hotpotqa | musique | LongBench-QA (average) |" in text
    assert "| m | 75.00 · 50.00 · 0.00 | 25.00 · 50.00 · 0.00 | 50.00 · 50.00 · 0.00 |" in text
    assert "| MemAgent-14B (paper) |  |  | 51.0 |" in text
    # BABILong: the configs by name, 0k and 1M
    assert "| Model | task | 0k | 1M |" in text
    assert "| m | qa1 | 50.00 · 50.00 · 0.00 | 0.00 · 0.00 · 0.00 |" in text
    summary = (tmp_path / "summary.md").read_text()
    assert "## babilong_qa1: sub_em by length" in summary and "| m | memory | 50.00 | 0.00 |" in summary


def test_no_benchmark_results_no_table(tmp_path):
    write_results(tmp_path, "hotpotqa", 50, [{"sub_em": 1.0}])
    report.write_report(tmp_path)
    assert not (tmp_path / "benchmarks.md").exists()
