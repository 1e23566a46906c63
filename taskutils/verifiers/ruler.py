"""RULER metrics: case-insensitive substring matching of reference strings in the prediction.

Definitions follow NVIDIA RULER ``scripts/eval/synthetic/constants.py`` (checked against the published file):
``string_match_all`` averages, over items, the fraction of an item's references that occur in its prediction;
``string_match_part`` averages, over items, 1 if any reference occurs. Both are reported by RULER on a 0-100
scale rounded to 2 decimals, and so are the batch functions here. The per-item functions ``match_all`` /
``match_part`` are on a 0-1 scale, which is what MemAgent's ``ruler_general.py`` stores per item (rounded to
2 decimals) as ``judge_sub_em`` before multiplying the mean by 100 for reporting.
"""

from __future__ import annotations

from collections.abc import Sequence

from taskutils.verifiers.lenient import extract_answer, final_text


def _check_refs(refs: Sequence[str]) -> None:
    # RULER would divide by zero; an item without references is a data error, so say so.
    if not refs:
        raise ValueError("an item needs at least one reference string")


def match_all(pred: str, refs: Sequence[str]) -> float:
    """Fraction in [0, 1] of ``refs`` contained in ``pred``, case-insensitively."""
    _check_refs(refs)
    pred = pred.lower()
    return sum(ref.lower() in pred for ref in refs) / len(refs)


def match_part(pred: str, refs: Sequence[str]) -> float:
    """1.0 if any of ``refs`` is contained in ``pred``, case-insensitively, else 0.0."""
    _check_refs(refs)
    pred = pred.lower()
    return float(any(ref.lower() in pred for ref in refs))


def _batch_mean(per_item: list[float]) -> float:
    if not per_item:
        raise ValueError("no predictions to score")
    return round(sum(per_item) / len(per_item) * 100, 2)


def _paired(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> zip:
    # RULER zips silently; a length mismatch here would hide a misaligned dataset.
    if len(preds) != len(refs):
        raise ValueError(f"{len(preds)} predictions but {len(refs)} reference lists")
    return zip(preds, refs, strict=True)


def string_match_all(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """RULER ``string_match_all``: mean of ``match_all`` over items, x100, rounded to 2 decimals."""
    return _batch_mean([match_all(pred, ref) for pred, ref in _paired(preds, refs)])


def string_match_part(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """RULER ``string_match_part``: mean of ``match_part`` over items, x100, rounded to 2 decimals."""
    return _batch_mean([match_part(pred, ref) for pred, ref in _paired(preds, refs)])


def ruler_scores(response: str, refs: Sequence[str]) -> dict:
    """Per-item score of a raw response on a non-QA RULER task, as MemAgent's evaluation does it.

    The prediction is the "the answer is" extraction of the lenient verifier; without that phrase (or with an
    empty extraction) the item scores 0 (as in MemAgent's evaluation). ``sub_em`` is ``match_all`` in [0, 1], rounded to
    2 decimals.
    """
    pred = extract_answer(final_text(response))
    if not pred:
        return {"pred": pred, "sub_em": 0}
    return {"pred": pred, "sub_em": round(match_all(pred, refs), 2)}
