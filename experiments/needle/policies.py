"""The replication's policies: a results file's model name (``rl-seed0``) and method make a policy (``rl``,
``memory-boxed``), shown under a name in the tables and figures of :mod:`experiments.needle.report` and
:mod:`experiments.needle.survival`."""

from __future__ import annotations

import re

_SEED = re.compile(r"-seed(\d+)$")
# Display order and names of the policies the replication script evaluates; others follow in name order.
POLICY_NAMES = {
    ("warm-start", "memory-boxed"): "warm start (SFT)",
    ("rl", "memory-boxed"): "RL",
    ("ablation-same-step", "memory-boxed"): "ablation: answer credit only, RL's step",
    ("ablation-token-mean", "memory-boxed"): "ablation: answer credit only, answer token-mean",
    ("ablation", "memory-boxed"): "ablation: final-answer credit only",
    ("warm-start", "direct-boxed"): "warm start, full context",
    ("rl", "direct-boxed"): "RL, full context",
    ("ablation-same-step", "direct-boxed"): "ablation (RL's step), full context",
    ("ablation-token-mean", "direct-boxed"): "ablation (answer token-mean), full context",
    ("ablation", "direct-boxed"): "ablation, full context",
}


def policy_of_model(model: str, method: str) -> tuple[str, str]:
    """The policy of a model's results: the model without its ``-seed<k>``, with the method."""
    return _SEED.sub("", model), method


def policy_name(policy: tuple[str, str]) -> str:
    return POLICY_NAMES.get(policy, f"{policy[0]} ({policy[1]})")
