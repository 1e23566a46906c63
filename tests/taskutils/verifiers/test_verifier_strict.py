"""Strict training verifier (docs/fidelity.md, "The two verifiers"): hand-worked cases."""

import numpy as np
import pytest

from taskutils.verifiers.strict import compute_score, last_boxed_answer, strict_score, strip_string

# len("\\boxed{paris}") == 13: backslash + "boxed" + "{" + "paris" + "}".
BOX = "\\boxed{paris}"


def test_box_length_used_below():
    assert len(BOX) == 13


def test_box_just_inside_the_300_char_window_is_seen():
    # 13 + 287 = 300 characters: the whole box is in the tail.
    assert strict_score(BOX + "x" * 287, "Paris") == 1.0


def test_box_before_the_300_char_window_is_not_seen():
    # 13 + 300 = 313 characters: the tail starts after the box, so there is no box at all.
    assert strict_score(BOX + "x" * 300, "Paris") == 0.0
    # Cut through the box: the tail starts at "boxed{paris}..." (backslash lost) -> still no box.
    assert strict_score(BOX + "x" * 288, "Paris") == 0.0


def test_last_boxed_wins():
    response = "First guess \\boxed{London}, on reflection \\boxed{Paris}."
    assert last_boxed_answer(response) == "Paris"
    assert strict_score(response, "Paris") == 1.0
    assert strict_score(response, "London") == 0.0


def test_boxed_with_space_runs_to_first_dollar():
    # Text after the last "\\boxed " up to the first "$".
    assert last_boxed_answer("so $\\boxed paris$ is it") == "paris"
    assert strict_score("so $\\boxed Paris$ is it", "paris") == 1.0
    # No "$": up to the end of the text.
    assert last_boxed_answer("\\boxed paris") == "paris"


def test_boxed_with_space_takes_precedence_over_a_later_braced_box():
    # The fork's verifier looks for "\\boxed " first, wherever it is.
    response = "$\\boxed london$ then \\boxed{paris}"
    assert last_boxed_answer(response) == "london"
    assert strict_score(response, "paris") == 0.0


def test_space_before_brace_keeps_the_braces():
    # "\\boxed {paris}" is the space form: the answer is "{paris}", braces included, so it fails "paris".
    assert last_boxed_answer("\\boxed {paris}") == "{paris}"
    assert strict_score("\\boxed {paris}", "paris") == 0.0


def test_nested_braces_are_matched():
    assert last_boxed_answer("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert strict_score("The result is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}") == 1.0
    # dfrac -> frac makes these equal.
    assert strict_score("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}") == 1.0


def test_unclosed_or_missing_box_gives_none():
    assert last_boxed_answer("no answer here") is None
    assert last_boxed_answer("cut off \\boxed{par") is None
    assert strict_score("cut off \\boxed{par", "par") == 0.0


def test_fbox_only_when_there_is_no_boxed():
    assert last_boxed_answer("\\fbox{paris}") == "paris"
    # A \\boxed anywhere takes precedence over a later \\fbox.
    assert last_boxed_answer("\\boxed{a} and \\fbox{b}") == "a"


def test_case_is_ignored():
    # Both sides are lower-cased (the README's "exact case" wording is wrong).
    assert strict_score("\\boxed{PARIS}", "Paris") == 1.0


def test_spaces_are_ignored():
    # strip_string removes every space: "new york" -> "newyork".
    assert strict_score("\\boxed{New York}", "newyork") == 1.0
    assert strict_score("\\boxed{newyork}", "New York") == 1.0


def test_punctuation_and_articles_are_not_ignored():
    # Articles and punctuation count: "thebeatles" != "beatles", "u.s." != "us".
    assert strict_score("\\boxed{the Beatles}", "Beatles") == 0.0
    assert strict_score("\\boxed{U.S.}", "US") == 0.0
    assert strict_score("\\boxed{Paris.}", "Paris") == 0.0


def test_max_over_ground_truths():
    response = "\\boxed{NYC}"
    assert strict_score(response, ["New York City", "NYC"]) == 1.0
    assert strict_score(response, ["New York City", "Big Apple"]) == 0.0
    assert strict_score(response, []) == 0.0


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("a\nb", "ab"),  # line breaks removed
        ("x \\! y", "xy"),  # \\! and spaces removed
        ("\\\\", "\\"),  # double backslash -> single
        ("\\tfrac{1}{2}", "\\frac{1}{2}"),
        ("\\left( 1 \\right)", "(1)"),
        ("90^{\\circ}", "90"),
        ("90^\\circ", "90"),
        ("\\$5", "5"),  # escaped dollar removed ...
        ("$5", "$5"),  # ... bare dollar kept
        ("50\\%", "50"),  # escaped percent removed ...
        ("50%", "50%"),  # ... bare percent kept
        ("a .5", "a0.5"),  # " ." -> " 0." before the spaces go
        ("{.5}", "{0.5}"),
    ],
)
def test_strip_string_steps(raw, expected):
    assert strip_string(raw) == expected


def test_compute_score_accepts_str_list_and_numpy():
    response = "Therefore \\boxed{Paris}"
    assert compute_score("hotpotqa", response, "paris") == 1.0
    assert compute_score("hotpotqa", response, ["London", "Paris"]) == 1.0
    assert compute_score("hotpotqa", response, np.array(["London", "Paris"], dtype=object)) == 1.0
    assert compute_score("hotpotqa", response, np.array(["London"])) == 0.0
    assert compute_score("hotpotqa", response, np.array("Paris"), extra_info={"index": 0}) == 1.0
