"""The benchmarks' own per-item metrics, as lm-evaluation-harness 0.4.13 scores them (docs/third_party_eval.md,
"LongBench-QA and BABILong"), written here from their definitions, not imported: the agreement is a test's job
(tests/taskutils/verifiers/test_verifier_benchmarks.py runs lm-eval's own functions on the same answers).

- LongBench QA (narrativeqa, qasper, multifieldqa_en, hotpotqa, 2wikimqa, musique): ``qa_f1_score``, token F1 after
  LongBench's normalisation (lower case, punctuation and the articles a/an/the removed, white space collapsed),
  the best over every gold answer; the prediction is the model's whole answer (lm-eval strips it first, which
  normalisation makes no difference to). Unlike HotpotQA's own F1 (:func:`taskutils.verifiers.f1_score`) a
  yes/no/noanswer answer gets partial credit like any other.
- BABILong (lm-eval's ``babilong_qa*`` tasks): 1 when the target, stripped and lower-cased, is a substring of the
  answer, stripped, its control characters turned into newlines, stripped again, lower-cased. (The BABILong
  authors' own check, ``compare_answers``, differs: it takes the first sentence and wants the target to be the only
  task label named outside the question; lm-eval's rule is the one here.)
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from taskutils.verifiers.lenient import normalize_answer

# LongBench's normalize_answer is SQuAD's, the lenient verifier's normalize_answer, step for step:
# lower(), punctuation out, articles out, white space collapsed.
_CONTROL = re.compile(r"[\x00-\x1f]")


def token_f1(prediction: str, gold: str) -> float:
    """LongBench's ``qa_f1_score`` of one gold: F1 of the normalised tokens (0 when none is shared)."""
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    shared = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if shared == 0:
        return 0.0
    precision, recall = shared / len(pred_tokens), shared / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def longbench_qa_f1(prediction: str, golds: Sequence[str]) -> float:
    """LongBench's score of one QA item: the best :func:`token_f1` over its gold answers, in [0, 1]."""
    if not golds:
        raise ValueError("a LongBench item needs at least one gold answer")
    return max(token_f1(prediction.strip(), gold) for gold in golds)


def babilong_answer(prediction: str) -> str:
    """What lm-eval's BABILong check reads of an answer: stripped, control characters as newlines, stripped."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def babilong_match(prediction: str, target: str) -> float:
    """lm-eval's BABILong score of one item: 1.0 when the target is in the answer, case-insensitively."""
    return float(target.strip().lower() in babilong_answer(prediction).lower())
