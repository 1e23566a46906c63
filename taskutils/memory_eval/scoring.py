"""Per-item scores for every method and task, strict and lenient side by side.

The two verifiers and the paper's protocol: ``docs/fidelity.md``, "Evaluation: the paper's protocol".

- strict: the training verifier (last ``\\boxed{}`` in the last 300 characters vs every gold). A response in the
  paper's "the answer is" format has no box, so strict is ~0 for the ``memory`` / ``direct`` methods: that is
  the protocol difference, not a failure.
- lenient: SQuAD-style em / sub_em / f1 on the extracted prediction against the first gold (the reference
  uses ``answers[0]``). The prediction is the "the answer is" extraction for the paper's prompt, the last
  boxed content for the boxed prompt. ``sub_em`` is the paper's headline metric.
- RULER non-QA tasks: ``sub_em`` is the fraction of gold strings found in the prediction (``match_all``); em
  and f1 do not apply (None).
- ``bench``: the benchmark's own metric, as lm-evaluation-harness scores the whole answer, for LongBench-QA (token F1,
  the best over every gold) and BABILong (the target in the answer); the other tasks' records have no such field
  (:mod:`taskutils.verifiers.benchmarks`).
A failed item scores 0 on every metric that applies: it stays in the denominator (the original dropped it).
"""

from __future__ import annotations

from typing import Any

from taskutils.memory_eval.config import BABILONG_QA, LONGBENCH_QA
from taskutils.verifiers import (
    babilong_match,
    boxed_scores,
    final_text,
    last_boxed_answer,
    lenient_scores,
    longbench_qa_f1,
    match_all,
    ruler_scores,
    strict_score,
)

HOTPOTQA = "hotpotqa"
# Scored as QA (em / sub_em / f1 against the first gold); "needle" is the CPU replication's task (a 4-digit answer).
QA_TASKS = frozenset({HOTPOTQA, "qa_1", "qa_2", "needle", *LONGBENCH_QA, *BABILONG_QA})
METRICS = ("strict", "em", "sub_em", "f1", "bench")
BENCH_TASKS = frozenset({*LONGBENCH_QA, *BABILONG_QA})  # the tasks whose benchmark has a metric of its own


def is_qa(task: str) -> bool:
    return task in QA_TASKS


def bench_score(task: str, response: str, gold: list[str]) -> float | None:
    """The benchmark's own metric of a whole answer, in [0, 1] rounded to 4 decimals (None: the task has none)."""
    if task in LONGBENCH_QA:
        return round(longbench_qa_f1(response, gold), 4)
    if task in BABILONG_QA:
        return babilong_match(response, gold[0])
    return None


GOLD_FIELDS = ("answers", "outputs")  # never shown to an agent


def golds(item: dict[str, Any]) -> list[str]:
    """The gold strings of an eval item: ``answers`` (HotpotQA) or ``outputs`` (RULER)."""
    value = item.get("answers", item.get("outputs"))
    if value is None:
        raise KeyError(f"item has neither 'answers' nor 'outputs'; columns: {sorted(item)}")
    value = [value] if isinstance(value, str) else [str(v) for v in value]
    if not value:
        raise ValueError("item has an empty gold list")
    return value


def score(task: str, final_prompt: str, response: str, gold: list[str]) -> dict[str, Any]:
    """``{"pred", "strict", "em", "sub_em", "f1"}`` of one raw response (None where a metric does not apply), and
    ``bench`` for the tasks of :data:`BENCH_TASKS`."""
    strict = strict_score(response, gold)
    if is_qa(task):
        lenient = (boxed_scores if final_prompt == "boxed" else lenient_scores)(response, gold[0])
        scores = {"pred": lenient["pred"], "strict": strict, **{k: lenient[k] for k in ("em", "sub_em", "f1")}}
        return scores | ({"bench": bench_score(task, response, gold)} if task in BENCH_TASKS else {})
    if final_prompt == "boxed":
        pred = last_boxed_answer(final_text(response))
        sub_em = round(match_all(pred, gold), 2) if pred else 0
    else:
        lenient = ruler_scores(response, gold)
        pred, sub_em = lenient["pred"], lenient["sub_em"]
    return {"pred": pred, "strict": strict, "em": None, "sub_em": sub_em, "f1": None}


def failed(task: str) -> dict[str, Any]:
    """The scores of an item whose requests failed: 0 wherever the metric applies."""
    qa = is_qa(task)
    scores = {"pred": None, "strict": 0.0, "em": 0 if qa else None, "sub_em": 0, "f1": 0 if qa else None}
    return scores | ({"bench": 0} if task in BENCH_TASKS else {})
