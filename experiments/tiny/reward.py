"""Dense rewards for :mod:`experiments.tiny.data`: how close the response is to the answer.

Both are verl custom reward functions (``compute_score(data_source, solution_str, ground_truth, extra_info,
**kwargs)``; ``reward.custom_reward_function.path=pkg://experiments.tiny.reward``, ``.name=...``).

- ``compute_score`` (the ``copy`` task): the character-level similarity ratio (``difflib``) between the
  normalised response and the answer, in [0, 1]: continuous, so responses of one GRPO group almost never tie
  and the advantages are non-zero even for a random model. ``acc`` is the exact match.
- ``compute_memory_score`` (the ``memory`` task, ``configs/tiny_cpu.yaml``): the same similarity, between the
  final answer's last ``\\boxed{}`` (the whole answer when it has none) and the answer, is the training
  reward (``score``, also reported as ``dense``); the strict training verifier (:mod:`taskutils.verifiers.strict`) is
  reported next to it as ``acc`` and ``strict``. verl keeps these keys as the final row's
  ``reward_extra_info``: ``recurrent/final/acc/mean`` in training and ``val-core/toy_memory/acc/mean@n`` in
  validation are the strict verdict, ``.../reward/...`` the dense score.
"""

from __future__ import annotations

import difflib
import re

from taskutils.verifiers.strict import TAIL_CHARS, last_boxed_answer
from taskutils.verifiers.strict import compute_score as strict_score

_SPACES = re.compile(r"\s+")


def normalise(text: str) -> str:
    return _SPACES.sub(" ", text).strip().lower()


def compute_score(data_source, solution_str: str, ground_truth: str, extra_info=None, **kwargs) -> dict:
    response, answer = normalise(solution_str), normalise(ground_truth)
    # Long rambles should not earn partial credit for containing the letters somewhere.
    response = response[: 2 * len(answer) + 8]
    score = difflib.SequenceMatcher(None, response, answer, autojunk=False).ratio()
    return {"score": float(score), "acc": float(response == answer)}


def compute_memory_score(data_source, solution_str: str, ground_truth, extra_info=None, **kwargs) -> dict:
    """Dense similarity of the final answer's box to the answer (the reward) plus the strict verdict."""
    if hasattr(ground_truth, "tolist"):  # numpy, as stored in verl's non-tensor batch
        ground_truth = ground_truth.tolist()
    answers = [str(gt) for gt in ground_truth] if isinstance(ground_truth, list | tuple) else [str(ground_truth)]
    boxed = last_boxed_answer(solution_str[-TAIL_CHARS:])
    candidate = solution_str if boxed is None else boxed
    dense = max(compute_score(data_source, candidate, answer)["score"] for answer in answers)
    strict = float(strict_score(data_source, solution_str, ground_truth, extra_info))
    return {"score": dense, "acc": strict, "dense": dense, "strict": strict}
