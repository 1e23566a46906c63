"""The choosing task through the replication pipeline at toy size (``TASK=choose QUICK=1 bash
scripts/replicate_cpu.sh``): its data, an RL step, the evaluation under its own task name and the report with the
asked needle's survival; and the script's refusals, before any work. Accuracy is not asserted
(docs/replication_cpu.md)."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "replicate_cpu.sh"
LENGTHS = (1, 2)
DOCS = 2


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    root = tmp_path_factory.mktemp("replicate_choose")
    out = root / "run"
    env = {**os.environ, "TASK": "choose", "QUICK": "1", "NGPUS": "1", "OUT_DIR": str(out)}
    env |= {"MEMAGENT_MODELS_DIR": str(root / "models"), "STEPS": "1"}
    env.pop("VERL_PLATFORM", None)
    done = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=1200, start_new_session=True
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.mark.trainer
@pytest.mark.slow(seconds=150)
@pytest.mark.timeout(1500)
def test_the_choosing_task_runs_through_every_stage(pipeline):
    stages = [json.loads(line)["stage"] for line in (pipeline / "timing.jsonl").read_text().splitlines()]
    assert stages == ["warm_start", "data_train", "data_test", "rl:rl-seed0", "rl_runs", "evaluation", "total"]
    # the eval sets are the choosing task's: four needles a document (DISTRACTORS=3), the asked one's chunk named
    for n in LENGTHS:
        items = [
            json.loads(x)
            for x in (pipeline / "eval_data/eval/test" / f"eval_choose_{n}.jsonl").read_text().split("\n")
            if x
        ]
        assert len(items) == DOCS
        for item in items:
            found = dict(re.findall(r"magic number for (\S+) is (\d{4})\.", item["context"]))
            assert len(found) == 4
            asked = re.search(r"number for (\S+) mentioned", item["input"]).group(1)
            assert item["answers"] == [found[asked]]
    # the report's table is the results files' (task choose), and the survival follows the asked needle
    results = pipeline / "results"
    expected = {}
    for n in LENGTHS:
        for model in ("warm-start", "rl-seed0"):
            lines = (results / f"choose_{n}" / f"{model}__memory-boxed.jsonl").read_text().splitlines()
            records = [json.loads(line) for line in lines]
            assert len(records) == DOCS and not any(r.get("error") for r in records)
            expected[(model, n)] = 100 * sum(r["strict"] for r in records) / DOCS
    with (results / "replication.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["method"] == "memory-boxed"]
    assert {(r["model"], int(r["length"])): float(r["strict"]) for r in rows} == pytest.approx(expected)
    with (results / "survival_events.csv").open() as f:
        events = list(csv.DictReader(f))
    assert len(events) == len(expected) * DOCS
    chunks = {}
    for n in LENGTHS:
        for line in (pipeline / "eval_data/eval/test" / f"eval_choose_{n}.jsonl").read_text().splitlines():
            item = json.loads(line)
            chunks[(n, str(item["index"]))] = item["needle_chunk"]
    assert all(int(e["needle_chunk"]) == chunks[(int(e["length"]), e["id"])] for e in events)
    # each RL run's memories by step, from its rollout dumps: one line per dumped step
    with (pipeline / "runs/rl-seed0/memories.csv").open() as f:
        steps = [int(r["step"]) for r in csv.DictReader(f)]
    dumped = sorted(int(p.stem) for p in (pipeline / "runs/rl-seed0/rollout").glob("*.jsonl"))
    assert steps == dumped and steps and (pipeline / "runs/rl-seed0/memories.png").is_file()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TASK": "haystack"}, "TASK=haystack: one of needle, choose"),
        ({"TASK": "choose", "DISTRACTORS": "0"}, "DISTRACTORS=0: the choosing task needs a whole number >= 1"),
        ({"TASK": "choose", "LATE_START": "0.5"}, "TASK=choose takes no LATE_START or DECOY_START"),
        ({"TASK": "choose", "CHOOSE_RECIPE": "oracle"}, "CHOOSE_RECIPE=oracle: one of choice, recall"),
        ({"CHOOSE_RECIPE": "recall"}, "CHOOSE_RECIPE=recall is a recipe of the choosing task (TASK=choose)"),
    ],
)
def test_the_script_refuses_a_bad_task_before_any_work(tmp_path, env, message):
    run = tmp_path / "run"
    done = subprocess.run(
        ["bash", str(SCRIPT)],
        env={**os.environ, **env, "OUT_DIR": str(run)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and message in done.stderr
    assert not run.exists()
