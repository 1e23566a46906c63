"""The training reward: MemAgent's strict verifier (``taskutils/verifiers/strict.py``) as verl's custom reward
function.

Configured with ``reward.custom_reward_function.path=pkg://verl_ext.reward`` and ``.name=compute_score``
(the ``reward.`` prefix: verl silently ignores the legacy top-level
``custom_reward_function`` key). verl's reward manager
decodes the *last* output of a trajectory (the final answer; special tokens skipped), calls this function
once per trajectory, writes the score at the final answer's last token, and the V1 worker copies it to
every memory turn of the trajectory (``agent_loop_tq.py:165-175``).

The score is a float in {0, 1}; verl's managers record it as ``acc`` too (the DAPO metric, and the
``val-core/<data_source>/acc`` validation metric).
"""

from __future__ import annotations

from typing import Any

from taskutils.verifiers import strict


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
) -> float:
    """1.0 if the last ``\\boxed{}`` in the final answer's tail matches a ground truth, else 0.0."""
    return strict.compute_score(data_source, solution_str, ground_truth, extra_info)
