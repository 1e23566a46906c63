"""The benchmarks' own metrics (taskutils.verifiers.benchmarks): worked by hand, then against lm-eval 0.4.13's own
functions (its LongBench metrics.get_qa_f1_score and BABILong common_utils.process_results, imported in the
lm-eval environment) on the same hand-written answers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from taskutils.memory_eval import scoring
from taskutils.verifiers import babilong_match, longbench_qa_f1, token_f1

REPO = Path(__file__).resolve().parents[3]


def test_longbench_f1_by_hand():
    # "The Eiffel Tower." vs "Eiffel Tower": articles, punctuation, case gone -> identical tokens
    assert token_f1("The Eiffel Tower.", "eiffel tower") == 1.0
    # "in Paris, France" vs "Paris": 1 shared of 3 predicted, 1 of 1 gold: P 1/3, R 1 -> F1 = 2/3 / (4/3) = 0.5
    assert token_f1("in Paris, France", "Paris") == pytest.approx(0.5)
    # the best of several golds: 1 of the 2 tokens of "William Shakespeare" (F1 2/3), all of "Shakespeare"
    assert longbench_qa_f1("Shakespeare", ["William Shakespeare", "Shakespeare"]) == 1.0
    assert longbench_qa_f1("Shakespeare", ["William Shakespeare"]) == pytest.approx(2 / 3)
    # yes/no get partial credit (HotpotQA's own F1 would give 0): "yes it is" vs "yes": P 1/3, R 1 -> 0.5
    assert longbench_qa_f1("yes it is", ["yes"]) == pytest.approx(0.5)
    # an empty answer, or one that normalises to nothing, shares no token
    assert longbench_qa_f1("", ["Paris"]) == 0.0
    assert longbench_qa_f1("The.", ["Paris"]) == 0.0
    # repeated tokens count as often as both sides have them: "paris paris" vs "paris": P 1/2, R 1 -> 2/3
    assert longbench_qa_f1("Paris Paris", ["Paris"]) == pytest.approx(2 / 3)


def test_babilong_match_by_hand():
    assert babilong_match("The most recent location of Mary is kitchen.", "kitchen") == 1.0
    assert babilong_match("  KITCHEN", " kitchen ") == 1.0  # stripped, case-insensitive
    assert babilong_match("bathroom", "kitchen") == 0.0
    assert babilong_match("", "kitchen") == 0.0
    # control characters become line breaks: "kit\tchen" no longer holds "kitchen"
    assert babilong_match("kit\tchen", "kitchen") == 0.0
    # a substring anywhere counts, even inside another word: lm-eval's rule, not the BABILong authors'
    assert babilong_match("kitchenette", "kitchen") == 1.0


def test_the_harness_records_the_benchmark_metric_beside_strict_and_lenient():
    got = scoring.score("longbench_hotpotqa", "answer_is", "Therefore, the answer is Paris, France.", ["Paris"])
    # lenient on the extraction "Paris, France" against the first gold; bench on the whole answer:
    # "therefore answer is paris france" vs "paris": P 1/5, R 1 -> 1/3
    assert (got["pred"], got["em"], got["sub_em"], got["f1"], got["strict"]) == ("Paris, France", 0.0, 1.0, 0.67, 0.0)
    assert got["bench"] == pytest.approx(0.3333)
    got = scoring.score("babilong_qa2", "answer_is", "Mary is in the kitchen", ["kitchen"])
    assert (got["pred"], got["sub_em"], got["bench"]) == (None, 0, 1.0)  # no "the answer is": lenient 0, bench 1
    assert scoring.failed("babilong_qa1")["bench"] == 0 and "bench" not in scoring.failed("hotpotqa")
    assert "bench" not in scoring.score("hotpotqa", "answer_is", "the answer is x", ["x"])


# (prediction, golds): articles, punctuation, case, several golds, an empty answer, control characters
CASES = [
    ("The Eiffel Tower.", ["eiffel tower"]),
    ("in Paris, France", ["Paris"]),
    ("Shakespeare", ["William Shakespeare", "Shakespeare"]),
    ("An apple a day", ["apple", "a day"]),
    ("yes it is", ["yes"]),
    ("", ["Paris"]),
    ("The.", ["Paris"]),
    ("Paris Paris", ["Paris"]),
    ("  KITCHEN\n", [" kitchen "]),
    ("The most recent location of Mary is kitchen.", ["kitchen"]),
    ("kit\tchen", ["kitchen"]),
    ("bathroom\x00kitchen", ["kitchen"]),
]

LM_EVAL_SCRIPT = """
import json, sys
from pathlib import Path
import lm_eval
tasks = Path(lm_eval.__file__).parent / "tasks"
sys.path[:0] = [str(tasks / "longbench"), str(tasks / "babilong")]
import metrics, common_utils
out = []
for prediction, golds in json.loads(sys.stdin.read()):
    f1 = metrics.get_qa_f1_score({"answers": golds}, [prediction])["qa_f1_score"]
    acc = common_utils.process_results({"target": golds[0]}, [prediction])["acc"]
    out.append([f1, acc])
print(json.dumps(out))
"""


def test_our_metrics_agree_with_lm_evals_functions():
    sys.path.insert(0, str(REPO / "scripts"))
    import third_party_eval as tpe

    python = tpe.lm_eval_python(tpe.DEFAULT_VENV)  # built by make setup; synced here if its lock changed
    run = subprocess.run(
        [str(python), "-c", LM_EVAL_SCRIPT], input=json.dumps(CASES), capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    theirs = json.loads(run.stdout.splitlines()[-1])
    ours = [[longbench_qa_f1(p, g), babilong_match(p, g[0])] for p, g in CASES]
    assert [v for pair in ours for v in pair] == pytest.approx([v for pair in theirs for v in pair])
    # the cases are not all alike: both metrics take both values over them
    assert {round(f1, 2) for f1, _ in theirs} >= {0.0, 0.5, 1.0} and {acc for _, acc in theirs} == {0.0, 1.0}
