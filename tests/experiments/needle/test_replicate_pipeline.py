"""The replication pipeline at toy size (``QUICK=1 bash scripts/replicate_cpu.sh``): every stage runs for real
(warm start, needle data, 2 RL steps of our trainer for each of two seeds, side by side as the full run's are,
evaluation through `transformers serve` at 2 lengths, the report), and the table's numbers are those of the results
files. Accuracy is not asserted: the full run is the
script (docs/replication_cpu.md)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "replicate_cpu.sh"
RUNS = ("rl-seed0", "rl-seed1")
MODELS = ("warm-start", *RUNS)
METHODS = ("memory-boxed", "direct-boxed")
LENGTHS = (1, 2)
DOCS = 2

pytestmark = [pytest.mark.trainer, pytest.mark.slow(seconds=200), pytest.mark.timeout(1500)]


def run_pipeline(out: Path, models_dir: Path) -> subprocess.CompletedProcess:
    # NGPUS=1: one FSDP rank and one rollout server a run (two ranks: test_cpu_memory_trainer.py); two seeds, two
    # runs side by side (RL_PARALLEL, the full run's default).
    env = {**os.environ, "QUICK": "1", "NGPUS": "1", "SEEDS": "0 1", "RL_PARALLEL": "2", "OUT_DIR": str(out)}
    env["MEMAGENT_MODELS_DIR"] = str(models_dir)
    env.pop("VERL_PLATFORM", None)
    return subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=1200, start_new_session=True
    )


def stages(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "timing.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    root = tmp_path_factory.mktemp("replicate_quick")
    out, models_dir = root / "run", root / "models"
    first = run_pipeline(out, models_dir)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    first_stages = stages(out)
    second = run_pipeline(out, models_dir)  # a rerun: everything is there, nothing is redone
    return {"out": out, "first": first, "first_stages": first_stages, "second": second}


def test_every_stage_ran_once_and_succeeded(pipeline):
    names = [s["stage"] for s in pipeline["first_stages"]]
    # the two runs' own lines in the order they ended, then the wall time of both
    assert names[:3] == ["warm_start", "data_train", "data_test"]
    assert sorted(names[3:5]) == ["rl:rl-seed0", "rl:rl-seed1"]
    assert names[5:] == ["rl_runs", "evaluation", "total"]
    assert all(s["rc"] == 0 for s in pipeline["first_stages"])


@pytest.mark.parametrize("name", RUNS)
def test_each_rl_run_trained_two_steps_from_the_warm_start(pipeline, name):
    run = pipeline["out"] / "runs" / name
    assert (run / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    steps = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        steps.setdefault(record["step"], {}).update(record["data"])
    assert {1, 2} <= set(steps)
    for step in (1, 2):  # the strict reward of the final answers, a number in [0, 1]
        assert 0.0 <= steps[step]["recurrent/final/reward/mean"] <= 1.0
    exported = run / "checkpoints" / "global_step_2" / "actor" / "huggingface"
    assert (exported / "model.safetensors").is_file() and (exported / "chat_template.jinja").is_file()
    table = (pipeline["out"] / "policies.yaml").read_text()
    assert str(exported) in table


def test_the_table_is_the_results_files(pipeline):
    results = pipeline["out"] / "results"
    expected = {}
    for model in MODELS:
        for method in METHODS:
            for n in LENGTHS:
                lines = (results / f"needle_{n}" / f"{model}__{method}.jsonl").read_text().splitlines()
                records = [json.loads(line) for line in lines]
                assert len(records) == DOCS and not any(r.get("error") for r in records)
                expected[(model, method, n)] = 100 * sum(r["strict"] for r in records) / DOCS
    for method in METHODS:  # the RL row of the table: the mean of the two seeds
        for n in LENGTHS:
            expected[("mean", method, n)] = sum(expected[(run, method, n)] for run in RUNS) / len(RUNS)
    with (results / "replication.csv").open() as f:
        table = {(r["model"], r["method"], int(r["length"])): float(r["strict"]) for r in csv.DictReader(f)}
    assert table == pytest.approx(expected)
    markdown = (results / "replication.md").read_text()
    assert f"| warm start (SFT) | 1 | {expected[('warm-start', 'memory-boxed', 1)]:.1f} |" in markdown
    assert (results / "replication.png").stat().st_size > 1000


def test_the_needles_survival_is_read_from_the_traced_results(pipeline):
    """The pipeline evaluates with --trace and the report writes the needle's survival: one event row per traced
    memory-agent item, its verdict the results file's."""
    results = pipeline["out"] / "results"
    for name in ("survival.md", "survival.csv", "survival_events.csv"):
        assert (results / name).stat().st_size > 0, name
    assert (results / "survival.png").stat().st_size > 1000
    with (results / "survival_events.csv").open() as f:
        events = {(r["model"], int(r["length"]), r["id"]): r["right"] == "True" for r in csv.DictReader(f)}
    expected = {}
    for model in MODELS:
        for n in LENGTHS:
            for line in (results / f"needle_{n}" / f"{model}__memory-boxed.jsonl").read_text().splitlines():
                record = json.loads(line)
                expected[(model, n, str(record["id"]))] = bool(record["strict"])
    assert events == expected
    assert "**The needle in memory**" in (results / "replication.md").read_text()


def test_a_rerun_redoes_nothing(pipeline):
    second = pipeline["second"]
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "rl-seed0: done (2 steps)" in second.stdout and "rl-seed1: done (2 steps)" in second.stdout
    new = stages(pipeline["out"])[len(pipeline["first_stages"]) :]
    assert [s["stage"] for s in new] == ["warm_start", "rl_runs", "evaluation", "total"]  # cached, done, resumed
    for model in MODELS:  # no item evaluated twice
        lines = (pipeline["out"] / "results" / "needle_1" / f"{model}__memory-boxed.jsonl").read_text().splitlines()
        assert len(lines) == DOCS


def test_the_table_says_what_ran(pipeline):
    """Each invocation's commit and command line (run.jsonl), and the stage times with the wall time, at the
    end of replication.md: the total is the sum of the invocations' total lines, here counted by hand."""
    out = pipeline["out"]
    invocations = [json.loads(line) for line in (out / "run.jsonl").read_text().splitlines()]
    assert len(invocations) == 2  # the first run and the rerun
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    assert all(inv["commit"].startswith(head.stdout.strip()) for inv in invocations)
    assert all("QUICK=1" in inv["command"] and "bash scripts/replicate_cpu.sh" in inv["command"] for inv in invocations)
    assert all(inv["cores"] == os.cpu_count() for inv in invocations)  # the machine's, not OMP_NUM_THREADS's 1
    markdown = (out / "results" / "replication.md").read_text()
    totals = [s["seconds"] for s in stages(out) if s["stage"] == "total"]
    assert len(totals) == 2
    assert f"Wall time, stages 1-5 of every invocation: {sum(totals)} s" in markdown
    assert f"commit `{invocations[0]['commit']}`" in markdown
    assert "The `rl:` stages ran side by side within `rl_runs`" in markdown
