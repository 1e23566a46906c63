"""Reward functions of the framework itself, for ``reward.custom_reward_function`` (``path: pkg://verl_ext.rewards``).

A reward function is verl's: ``compute_score(data_source, solution_str, ground_truth, extra_info)``, called on the
trajectory's last reply (``solution_str``), with the whole trajectory in ``extra_info`` (every call's messages and
reply, the sample, the agent's own score: verl_ext/agent_loop_manager.py; docs/write_your_own_agent.md, "A reward
over the whole trajectory").
"""

from __future__ import annotations

from typing import Any


def agent_score(
    data_source: Any, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None, **_: Any
) -> float:
    """The agent's own score of its run (``return Answer(text, score=...)`` of ``recurrent.functions``); a run that
    names this reward and an agent that returns no score fails that trajectory, saying so."""
    score = (extra_info or {}).get("agent_score")
    if score is None:
        raise ValueError(
            "reward verl_ext.rewards.agent_score: the agent returned no score; return "
            "recurrent.functions.Answer(text, score=...) from the agent function"
        )
    return float(score)
