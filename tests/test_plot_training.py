"""scripts/plot_training.py names the run's reward in the plot: the final answers' verdict (``acc``) is "strict
verifier" only for a run whose config loads the paper's strict verifier; another reward function is named, and a
run with no config, or verl's scorer by data source, says "reward"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "plot_training.py"
sys.path.insert(0, str(SCRIPT.parent))
import plot_training  # noqa: E402

NONE = {"path": None, "name": None}


def run_folder(root: Path, reward: dict, legacy: dict = NONE) -> Path:
    """A run folder as scripts/train_tiny_cpu.sh leaves it: metrics.jsonl and Hydra's config of the run (the
    launcher's hydra.run.dir), an older one of another run beside it."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": step, "data": {"recurrent/final/reward/mean": r, "recurrent/final/acc/mean": a}}) + "\n"
            for step, r, a in ((1, 0.5, 0.25), (2, 0.75, 0.5))
        )
    )
    for stamp, function in (
        ("20260101-000000", {"path": "pkg://old.reward", "name": "old"}),
        ("20260102-000000", reward),
    ):
        config = root / "hydra" / stamp / ".hydra" / "config.yaml"
        config.parent.mkdir(parents=True)
        config.write_text(
            yaml.safe_dump({"custom_reward_function": legacy, "reward": {"custom_reward_function": function}})
        )
    return root


STRICT = {"path": "pkg://taskutils.verifiers.strict", "name": "compute_score"}
USERS = {"path": "/home/user/agents/hotcold_reward.py", "name": "trajectory_reward"}


@pytest.mark.parametrize(
    ("reward", "legacy", "label"),
    [
        (STRICT, NONE, "strict verifier"),  # configs/memory_agent.yaml's
        ({"path": "taskutils/verifiers/strict.py", "name": "compute_score"}, NONE, "strict verifier"),
        (USERS, NONE, "trajectory_reward"),
        (STRICT, USERS, "trajectory_reward"),  # verl moves a set top-level custom_reward_function over reward's
        ({"path": "pkg://taskutils.verifiers.strict", "name": "lenient_score"}, NONE, "lenient_score"),
        ({"path": None, "name": "compute_score"}, NONE, "reward"),  # verl's own scorer by data_source
    ],
)
def test_the_label_is_the_runs_reward(tmp_path, reward, legacy, label):
    folder = run_folder(tmp_path, reward, legacy)
    assert plot_training.reward_label(plot_training.run_config([str(folder)])) == label


def test_a_run_without_its_config_says_reward(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "data": {"recurrent/final/acc/mean": 1.0}}) + "\n")
    assert plot_training.run_config([str(tmp_path), str(tmp_path / "metrics.jsonl")]) is None
    assert plot_training.reward_label(None) == "reward"


def test_the_plot_of_a_users_reward_does_not_say_strict_verifier(tmp_path):
    folder = run_folder(tmp_path / "run", USERS)
    steps = plot_training.read_steps(plot_training.metric_files([str(folder)]))
    labels = plot_training.plot(
        steps, tmp_path / "a.png", plot_training.reward_label(plot_training.run_config([str(folder)]))
    )
    assert labels == ["train: final-answer reward", "train: trajectory_reward (acc)"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(folder), "--out", str(tmp_path / "b.png")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "(the final answers' verdict by: trajectory_reward)" in done.stdout
    assert (tmp_path / "b.png").stat().st_size > 0
