"""``examples/one_step.py``, the walkthrough of one training step, runs and does what it prints."""

from __future__ import annotations

import pytest
from vx_helpers import load_example


def test_one_step_walkthrough(capsys):
    result = load_example("one_step").main(["--n", "4", "--seed", "0"])
    printed = capsys.readouterr().out
    for stage in (
        "[1] config tiny_cpu",
        "[2] trajectory 3:",
        "[3] prompt0_3: reward",
        "[4] row prompt0_0_0:",
        "[5] loss",
    ):
        assert stage in printed, stage
    rewards = result["rewards"]
    assert len(rewards) == 4 and len(set(rewards.values())) > 1  # the dense reward differs within the group
    mean = sum(rewards.values()) / len(rewards)
    for key, advantage in zip(result["keys"], result["advantages"], strict=True):
        trajectory = key.rsplit("_", 1)[0]
        # GRPO by hand: the trajectory's reward minus the group mean, on every token of every one of its turns
        assert advantage.tolist() == pytest.approx([rewards[trajectory] - mean] * len(advantage), abs=1e-6)
    for trajectory, delta in result["change"].items():
        if abs(rewards[trajectory] - mean) > 1e-6:  # the step moves each trajectory's log-probability its way
            assert (delta > 0) == (rewards[trajectory] > mean), (trajectory, delta)
