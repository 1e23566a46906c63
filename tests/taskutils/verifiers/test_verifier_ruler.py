"""RULER metrics (NVIDIA RULER scripts/eval/synthetic/constants.py semantics): hand-worked cases."""

import pytest

from taskutils.verifiers.ruler import match_all, match_part, ruler_scores, string_match_all, string_match_part


def test_match_all_partial_fraction():
    # "123" and "456" occur, "789" and "000" do not: 2 of 4 -> 0.5.
    assert match_all("Numbers: 123, 456", ["123", "456", "789", "000"]) == 0.5


def test_match_all_is_case_insensitive():
    assert match_all("The KEY is apple", ["Apple", "key"]) == 1.0


def test_match_part():
    assert match_part("it is in paris", ["Paris", "France"]) == 1.0  # one is enough
    assert match_part("it is in berlin", ["Paris", "France"]) == 0.0


def test_string_match_all_batch_is_percent():
    # Items: 2/4 = 0.5 and 1/1 = 1.0 -> mean 0.75 -> 75.0 on RULER's 0-100 scale.
    preds = ["a 123 456", "789"]
    refs = [["123", "456", "789", "000"], ["789"]]
    assert string_match_all(preds, refs) == 75.0
    # 1/3 * 100 = 33.333... -> rounded to 33.33.
    assert string_match_all(["x1"], [["x1", "x2", "x3"]]) == 33.33


def test_string_match_part_batch_is_percent():
    # Items: 1 (paris found) and 0 (london absent) -> 50.0.
    assert string_match_part(["paris", "berlin"], [["Paris", "France"], ["London"]]) == 50.0


def test_bad_inputs_raise():
    with pytest.raises(ValueError):
        string_match_all(["a"], [["a"], ["b"]])
    with pytest.raises(ValueError):
        match_all("a", [])
    with pytest.raises(ValueError):
        string_match_part([], [])


def test_ruler_scores_needs_the_trigger_phrase():
    # pred "123, 456" holds 2 of 3 references -> 0.666... -> 0.67.
    scores = ruler_scores("Therefore, the answer is 123, 456.", ["123", "456", "789"])
    assert scores == {"pred": "123, 456", "sub_em": 0.67}
    # As in MemAgent's evaluation: every reference is present, but without "the answer is" the item scores 0.
    assert ruler_scores("123 456 789", ["123", "456", "789"]) == {"pred": None, "sub_em": 0}
