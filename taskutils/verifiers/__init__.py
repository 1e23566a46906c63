"""Answer verifiers shared by training rewards (strict) and evaluation (lenient, RULER, the benchmarks' own)."""

from taskutils.verifiers.benchmarks import babilong_match, longbench_qa_f1, token_f1
from taskutils.verifiers.lenient import (
    boxed_scores,
    exact_match,
    extract_answer,
    extract_solution,
    f1_score,
    final_text,
    lenient_scores,
    normalize_answer,
    score_prediction,
    sub_exact_match,
)
from taskutils.verifiers.ruler import match_all, match_part, ruler_scores, string_match_all, string_match_part
from taskutils.verifiers.strict import compute_score, is_equiv, last_boxed_answer, strict_score, strip_string

__all__ = [
    "babilong_match",
    "boxed_scores",
    "compute_score",
    "exact_match",
    "extract_answer",
    "extract_solution",
    "f1_score",
    "final_text",
    "is_equiv",
    "last_boxed_answer",
    "lenient_scores",
    "longbench_qa_f1",
    "match_all",
    "match_part",
    "normalize_answer",
    "ruler_scores",
    "score_prediction",
    "strict_score",
    "string_match_all",
    "string_match_part",
    "strip_string",
    "sub_exact_match",
    "token_f1",
]
