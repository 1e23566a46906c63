"""Strict training verifier: last boxed answer in the response tail vs. the ground truths.

The rules in words: ``docs/fidelity.md``, "The two verifiers".

It is the reward of RL training and of training-time validation. It is deliberately strict: case and
whitespace are ignored, punctuation and articles are not ("the beatles" != "beatles").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Only the tail is inspected: the final answer is expected at the end, and a box earlier in a long
# response (e.g. quoted from memory) must not be rewarded.
TAIL_CHARS = 300


def _braced_argument(text: str, command: str) -> str | None:
    """Argument of the last ``command{...}`` in ``text``, braces matched; None if absent or unbalanced."""
    start = text.rfind(command)
    if start < 0:
        return None
    open_pos = start + len(command)
    # The last occurrence must be a braced call; a malformed last box is not replaced by an earlier one.
    if open_pos >= len(text) or text[open_pos] != "{":
        return None
    depth = 0
    for pos in range(open_pos, len(text)):
        if text[pos] == "{":
            depth += 1
        elif text[pos] == "}":
            depth -= 1
            if depth == 0:
                return text[open_pos + 1 : pos]
    return None  # never closed, e.g. the response was cut off inside the box


def last_boxed_answer(text: str) -> str | None:
    """The content of the last boxed expression in ``text``, wrapper stripped, or None.

    Precedence follows the fork's verifier: if ``\\boxed `` (with a space) occurs anywhere, the answer is the text after
    its last occurrence up to the first ``$`` (or the end), even if a ``\\boxed{...}`` comes later. Otherwise
    the last ``\\boxed{...}`` is used, and only when no ``\\boxed`` occurs at all the last ``\\fbox{...}``.
    The wrapper is stripped for both forms, as in the fork, so ``\\fbox{x}`` yields ``x``.
    """
    if "\\boxed " in text:
        return text.split("\\boxed ")[-1].split("$")[0]
    if "\\boxed" in text:
        return _braced_argument(text, "\\boxed")
    return _braced_argument(text, "\\fbox")


def strip_string(string: str) -> str:
    """Hendrycks-MATH style normalisation, restricted to the steps known to be in the fork's verifier.

    The steps run in the order of the original MATH code, so that ``" ."`` -> ``" 0."`` is applied before the
    spaces are removed (in the other order it could never fire).

    Left out here: the full Hendrycks ``strip_string`` also drops right-hand
    ``\\text{ ...}`` units, prefixes a leading ``.`` with ``0``, drops a short ``k =`` prefix, rewrites
    ``sqrt3``/``\\frac12``/``a/b``/``0.5`` into braced LaTeX, and falls back to raw equality when a step
    raises. They are not
    known to be in the fork's verifier, so they are not applied; they only matter for LaTeX maths
    answers, not for HotpotQA-style entity answers.
    """
    string = string.replace("\n", "")
    string = string.replace("\\!", "")
    string = string.replace("\\\\", "\\")
    string = string.replace("tfrac", "frac").replace("dfrac", "frac")
    string = string.replace("\\left", "").replace("\\right", "")
    string = string.replace("^{\\circ}", "").replace("^\\circ", "")
    # Only the escaped forms go: a bare "$" or "%" is part of the answer.
    string = string.replace("\\$", "")
    string = string.replace("\\%", "")
    string = string.replace(" .", " 0.").replace("{.", "{0.")
    return string.replace(" ", "")


def is_equiv(answer: str, ground_truth: str) -> bool:
    """True if both strings are equal after ``strip_string``."""
    return strip_string(answer) == strip_string(ground_truth)


def _as_list(ground_truths: Any) -> list[str]:
    """Accept a string, a list/tuple, or a numpy array (0-d or 1-d) of strings."""
    if hasattr(ground_truths, "tolist"):  # numpy arrays as stored in verl's non_tensor_batch
        ground_truths = ground_truths.tolist()
    if isinstance(ground_truths, str):
        return [ground_truths]
    if isinstance(ground_truths, Iterable):
        return [str(gt) for gt in ground_truths]
    return [str(ground_truths)]


def strict_score(response: str, ground_truths: str | list[str]) -> float:
    """1.0 if the last boxed answer in the last 300 lower-cased characters matches any ground truth, else 0.0."""
    tail = response[-TAIL_CHARS:].lower()
    answer = last_boxed_answer(tail)
    if answer is None:
        return 0.0
    # Max over ground truths; an empty list scores 0.
    return max((1.0 if is_equiv(answer, gt.lower()) else 0.0 for gt in _as_list(ground_truths)), default=0.0)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> float:
    """verl custom-reward-function entry point (``custom_reward_function.name=compute_score``).

    ``data_source`` and ``extra_info`` are accepted for the signature and ignored: every source uses the same
    strict verifier. ``ground_truth`` may be a string, a list, or a numpy array of strings.
    """
    return strict_score(solution_str, _as_list(ground_truth))
