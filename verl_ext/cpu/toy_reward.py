"""Dense reward for :mod:`verl_ext.cpu.toy_data`: how close the response is to the words to repeat.

``compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)`` is verl's custom reward
function signature (``reward.custom_reward_function.path=pkg://verl_ext.cpu.toy_reward``). The score is
the character-level similarity ratio (``difflib``) between the normalised response and the answer, in
[0, 1]: continuous, so responses of one GRPO group almost never tie and the advantages are non-zero even
for a random model. ``acc`` is the exact match.
"""

from __future__ import annotations

import difflib
import re

_SPACES = re.compile(r"\s+")


def normalise(text: str) -> str:
    return _SPACES.sub(" ", text).strip().lower()


def compute_score(data_source, solution_str: str, ground_truth: str, extra_info=None, **kwargs) -> dict:
    response, answer = normalise(solution_str), normalise(ground_truth)
    # Long rambles should not earn partial credit for containing the letters somewhere.
    response = response[: 2 * len(answer) + 8]
    score = difflib.SequenceMatcher(None, response, answer, autojunk=False).ratio()
    return {"score": float(score), "acc": float(response == answer)}
