"""Lenient test verifier (docs/fidelity.md, "The two verifiers"): hand-worked cases."""

import pytest

from taskutils.verifiers.lenient import (
    boxed_scores,
    exact_match,
    extract_answer,
    extract_solution,
    f1_score,
    lenient_scores,
    normalize_answer,
    score_prediction,
    sub_exact_match,
)

ZERO = {"pred": None, "em": 0, "sub_em": 0, "f1": 0}


def test_extract_solution_takes_text_after_last_think():
    assert extract_solution("reasoning</think> final ") == "final"
    assert extract_solution("a</think>b</think> c ") == "c"
    assert extract_solution("no think tag") == "no think tag"


def test_extract_answer_basic_and_cleanup():
    assert extract_answer("Therefore, the answer is Paris.") == "Paris"
    # DeepSeek end tokens, spaces and dots are stripped.
    assert extract_answer("the answer is Paris.<｜end▁of▁sentence｜>") == "Paris"
    assert extract_answer("the answer is  ..Paris... ") == "Paris"


def test_extract_answer_is_case_sensitive():
    # The trigger is case-sensitive: only "The answer is" with a capital T -> no extraction.
    assert extract_answer("Therefore, The answer is Paris.") is None
    assert extract_answer("no trigger phrase at all") is None


def test_extract_answer_last_lowercase_occurrence_wins():
    text = "At first the answer is London. Wait, the answer is Paris. The answer is Rome."
    # The capitalised last sentence is ignored; the last lower-case occurrence is "Paris. The answer is Rome".
    assert extract_answer(text) == "Paris. The answer is Rome"
    assert extract_answer("the answer is London. Actually the answer is Paris.") == "Paris"


def test_extract_answer_strips_markdown_bold():
    # "*" removed first, so "**the answer is**" still triggers and the bold does not leak.
    assert extract_answer("So **the answer is Paris**.") == "Paris"
    assert extract_answer("the answer is **Paris**") == "Paris"


def test_normalize_answer():
    # lower -> drop punctuation -> drop a/an/the -> collapse spaces.
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words


def test_exact_match():
    assert exact_match("The Beatles", "beatles") == 1.0
    assert exact_match("Beatles band", "beatles") == 0.0


def test_sub_exact_match_is_bidirectional():
    assert sub_exact_match("Paris, France", "Paris") == 1.0  # gold in pred
    assert sub_exact_match("Paris", "Paris, France") == 1.0  # pred in gold
    assert sub_exact_match("London", "Paris") == 0.0


def test_sub_exact_match_empty_normalised_prediction_counts():
    # sub_em is bidirectional: "the" normalises to "", and "" is a substring of every gold.
    assert normalize_answer("the") == ""
    assert sub_exact_match("the", "Paris") == 1.0


def test_f1_partial_overlap():
    # "the big red apple" -> "big red apple" (3 tokens); "red apple pie" (3 tokens); common {red, apple} = 2.
    # precision = 2/3, recall = 2/3, F1 = 2 * (2/3) * (2/3) / (4/3) = 2/3.
    assert f1_score("the big red apple", "red apple pie") == pytest.approx(2 / 3)
    # "red apple" (2) vs "red apple pie" (3), common 2: P = 1, R = 2/3, F1 = (4/3) / (5/3) = 0.8.
    assert f1_score("red apple", "red apple pie") == pytest.approx(0.8)
    assert f1_score("banana", "red apple pie") == 0.0


def test_f1_yes_no_rule():
    assert f1_score("yes", "no") == 0.0
    # Gold "yes" is special and differs from "yes it is", so 0 despite the shared token.
    assert f1_score("yes it is", "yes") == 0.0
    assert f1_score("Yes.", "yes") == 1.0  # both normalise to "yes"
    assert f1_score("noanswer", "noanswer") == 1.0


def test_lenient_scores_correct_answer():
    scores = lenient_scores("Therefore, the answer is the Beatles.", "The Beatles")
    assert scores == {"pred": "the Beatles", "em": 1.0, "sub_em": 1.0, "f1": 1.0}


def test_lenient_scores_capital_t_only_scores_zero():
    assert lenient_scores("Therefore, The answer is Paris.", "Paris") == ZERO


def test_lenient_scores_article_only_prediction():
    # Extracted "the" -> normalises to "": em 0 ("" != "paris"), sub_em 1 (bidirectional), f1 0 (no tokens).
    assert lenient_scores("Well, the answer is the.", "Paris") == {"pred": "the", "em": 0.0, "sub_em": 1.0, "f1": 0.0}


def test_lenient_scores_empty_extraction_scores_zero():
    # "the answer is ." cleans to "", which the reference treats like a missing prediction.
    assert lenient_scores("the answer is .", "Paris") == {"pred": "", "em": 0, "sub_em": 0, "f1": 0}


def test_lenient_scores_rounds_to_two_decimals():
    # f1 = 2/3 from test_f1_partial_overlap, rounded to 0.67.
    scores = lenient_scores("the answer is the big red apple", "red apple pie")
    assert scores == {"pred": "the big red apple", "em": 0.0, "sub_em": 0.0, "f1": 0.67}


def test_lenient_scores_uses_text_after_think():
    response = "<think>maybe the answer is London</think>Therefore, the answer is Paris."
    assert lenient_scores(response, "Paris")["pred"] == "Paris"
    # Answer only inside the thinking and nothing after </think>: falls back to the whole response, so the
    # extraction keeps the trailing tag ("Paris</think>" normalises to "paristhink", which contains "paris").
    scores = lenient_scores("<think>so the answer is Paris</think>", "Paris")
    assert scores == {"pred": "Paris</think>", "em": 0.0, "sub_em": 1.0, "f1": 0.0}


def test_score_prediction_none():
    assert score_prediction(None, "Paris") == ZERO


def test_boxed_scores():
    response = "<think>\\boxed{London}</think> So the final answer is \\boxed{Paris}."
    assert boxed_scores(response, "paris") == {"pred": "Paris", "em": 1.0, "sub_em": 1.0, "f1": 1.0}
    assert boxed_scores("no box", "paris") == ZERO
    # No 300-character window at evaluation time.
    assert boxed_scores("\\boxed{Paris}" + "x" * 400, "Paris")["em"] == 1.0
