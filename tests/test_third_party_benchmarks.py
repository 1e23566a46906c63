"""scripts/third_party_benchmarks.py run for real at toy size: lm-eval 0.4.13's own longbench_hotpotqa and babilong_qa1
(local files in the published formats) through our endpoint, and our harness on the same items, both evaluating the
memory agent; per item, equal answers and equal scores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow(seconds=100)  # ~60 s CPU: lm-eval twice, two endpoints, the upstream; 70-110 s on the shared cores
def test_lm_eval_benchmarks_score_each_item_as_our_harness(tmp_path):
    work = tmp_path / "work"
    argv = ["--model", "tiny", "--items", "2", "--prompt", "harness", "--work", str(work)]
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "third_party_benchmarks.py"), *argv],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads((work / "comparison.json").read_text())
    for task in ("longbench_hotpotqa", "babilong_qa1"):
        rows = summary["tasks"][task]
        assert [r["id"] for r in rows] == [0, 1]
        assert all(r["our_answer"] and r["our_answer"] == r["lm_eval_answer"] for r in rows)
        assert all(r["our_score"] is not None and r["our_score"] == r["lm_eval_score"] for r in rows)
        assert all(r["prompt_added_chars"] == 0 for r in rows)  # both routes read the same document and question
    # the golds our harness scored are the published records' answers (BABILong: its one target)
    assert [r["gold"] for r in summary["tasks"]["babilong_qa1"]] == [["kitchen"], ["bedroom"]]
    assert summary["tasks"]["longbench_hotpotqa"][1]["gold"] == ["William Shakespeare", "Shakespeare"]
    assert "2 of 2 items: equal scores; 2 of 2: equal answers." in run.stdout
