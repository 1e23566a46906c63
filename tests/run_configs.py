"""The run config a user writes to train an agent of their own on the CPU trainer (docs/write_your_own_agent.md):
verl's configs on the search path, the framework's trainer and the CPU platform, the agent and its settings, the
budgets a reply of ``max_tokens`` needs, and the reward function. One definition for the tests that compose or
train such a run; each adds the settings its check needs."""

from __future__ import annotations

from typing import Any

import yaml

PROMPT_TOKENS = 256  # data.max_prompt_length of these runs: the chat template of a short question fits in it


def cpu_run_config(
    agent: str,
    *,
    max_tokens: int,
    reward: tuple[str, str] = ("pkg://taskutils.verifiers.strict", "compute_score"),
    agent_config: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
) -> str:
    """The YAML text. ``agent_config`` is ``recurrent.config`` (left out when None); ``settings`` are further keys by
    their dotted path (``"actor_rollout_ref.rollout.n": 2``)."""
    config: dict[str, Any] = {
        "hydra": {"searchpath": ["pkg://verl.trainer.config"]},
        "defaults": ["recurrent_trainer", "cpu_platform", "_self_"],
        "recurrent": {"agent": agent},
        "data": {"max_prompt_length": PROMPT_TOKENS, "max_response_length": max_tokens},
        "actor_rollout_ref": {"rollout": {"max_model_len": PROMPT_TOKENS + max_tokens}},
        "reward": {"custom_reward_function": {"path": reward[0], "name": reward[1]}},
    }
    if agent_config is not None:
        config["recurrent"]["config"] = agent_config
    for dotted, value in (settings or {}).items():
        *parents, key = dotted.split(".")
        section = config
        for name in parents:
            section = section.setdefault(name, {})
        section[key] = value
    return yaml.safe_dump(config, sort_keys=False)
