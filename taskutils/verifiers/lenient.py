"""Lenient test verifier: "the answer is" extraction plus SQuAD-style EM / sub-EM / F1.

The rules and their quirks, in words: ``docs/fidelity.md``, "The two verifiers".

This is the protocol behind the paper's reported numbers; the headline metric is ``sub_em``.
"""

from __future__ import annotations

import re
import string
from collections import Counter

from taskutils.verifiers.strict import last_boxed_answer

TRIGGER = "the answer is"  # matched case-sensitively, as in the original: "The answer is X" alone is not extracted
# End-of-turn markers a DeepSeek-R1-style model may leave in the raw content.
DEEPSEEK_END_TOKENS = ("<｜Assistant｜>", "<｜end▁of▁sentence｜>")
THINK_CLOSE = "</think>"
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)
# f1 refuses partial credit when either side is one of these and they differ (HotpotQA's rule).
_SPECIAL_ANSWERS = ("yes", "no", "noanswer")


def extract_solution(response: str) -> str:
    """The text after the last ``</think>`` (stripped), or the whole response if there is no ``</think>``."""
    if THINK_CLOSE not in response:
        return response
    return response.split(THINK_CLOSE)[-1].strip()


def extract_answer(response: str) -> str | None:
    """The text after the last lower-case "the answer is", cleaned; None if the phrase is absent.

    ``*`` is removed first so markdown bold ("the answer is **Paris**") does not leak into the answer. After the
    phrase, the DeepSeek end tokens, surrounding whitespace and surrounding dots are stripped.
    """
    response = response.replace("*", "")
    if TRIGGER not in response:
        return None
    answer = response.rsplit(TRIGGER, 1)[-1].strip()
    for token in DEEPSEEK_END_TOKENS:
        answer = answer.replace(token, "")
    return answer.strip().strip(".").strip()


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 if the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def sub_exact_match(prediction: str, gold: str) -> float:
    """1.0 if either normalised string contains the other, else 0.0.

    Bidirectional on purpose, as in the original. A consequence kept for faithfulness: a prediction that
    normalises to the empty string (e.g. "the", or ".") is a substring of every gold and counts as correct.
    """
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    return float(ref in pred or pred in ref)


def f1_score(prediction: str, gold: str) -> float:
    """Token-level F1 of the normalised strings (HotpotQA official definition)."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if (pred in _SPECIAL_ANSWERS or ref in _SPECIAL_ANSWERS) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    num_same = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def score_prediction(pred: str | None, gold: str) -> dict:
    """Per-item ``{"pred", "em", "sub_em", "f1"}``, each metric rounded to 2 decimals as in the reference.

    A missing prediction scores 0 on all metrics. So does an empty-string prediction: the reference tests
    ``if pred`` rather than ``pred is None``, so "the answer is ." (which cleans to "") scores 0, while "the
    answer is the." (which cleans to "the", normalising to "") is sub-EM correct.
    """
    if not pred:
        return {"pred": pred, "em": 0, "sub_em": 0, "f1": 0}
    return {
        "pred": pred,
        "em": round(exact_match(pred, gold), 2),
        "sub_em": round(sub_exact_match(pred, gold), 2),
        "f1": round(f1_score(pred, gold), 2),
    }


def final_text(response: str) -> str:
    """The part of a raw response that is scored: after ``</think>``, or the whole response if that is empty."""
    response = response.strip()
    # The reference falls back to the whole response when nothing follows </think>.
    return extract_solution(response) or response


def lenient_scores(response: str, gold: str) -> dict:
    """Score a raw model response against one gold answer with the "the answer is" protocol (methods
    ``openai`` / ``recurrent``). Only one gold is used, as the reference uses ``answers[0]``."""
    return score_prediction(extract_answer(final_text(response)), gold)


def boxed_scores(response: str, gold: str) -> dict:
    """Same lenient metrics, but the prediction is the last boxed answer (methods ``boxed`` /
    ``recurrent-boxed``).

    Decided here (the original's boxed evaluation is known only to take the last ``\\boxed{}``): the box is searched in
    the whole post-``</think>`` text, without the strict verifier's 300-character window or lower-casing (normalisation
    lower-cases).
    """
    return score_prediction(last_boxed_answer(final_text(response)), gold)
