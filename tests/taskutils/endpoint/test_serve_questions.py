"""The question modes as rules over a request's user messages, each case worked out by hand."""

from __future__ import annotations

import pytest

from taskutils.endpoint.questions import Found, QuestionError, find_question


def test_split_takes_the_text_after_the_last_blank_line():
    text = "Doc one.\n\nDoc two.\n \t\nQuestion: who? Answer:\n\n"  # a blank line may hold spaces; trailing ones go
    assert find_question([text], "split") == Found("Doc one.\n\nDoc two.", "Question: who? Answer:", "split")


def test_split_blank_lines_pair_up_from_the_left_and_trailing_blank_lines_are_not_a_split():
    # Three newlines: the first two are a blank line, the third starts the question; the blank lines at the end
    # are trailing whitespace, not the split (worked out by hand from "a line holding only spaces or tabs").
    assert find_question(["Doc.\n\n\nWhy?\n\n \n"], "split") == Found("Doc.", "\nWhy?", "split")
    assert find_question(["Doc.\u2028\n\nWhy?\u3000"], "split") == Found("Doc.\u2028", "Why?", "split")


def test_split_at_a_marker_takes_its_last_occurrence_and_drops_it():
    text = "Q: in the document\nmore text\nQ: the real question?"
    assert find_question([text], "split", "Q:") == Found(
        "Q: in the document\nmore text\n", " the real question?", "split"
    )


def test_split_joins_several_user_messages_first():
    assert find_question(["Doc.", "More doc.\n\nWhy?"], "split") == Found("Doc.\n\nMore doc.", "Why?", "split")


def test_messages_takes_every_earlier_user_message_as_the_document():
    found = find_question(["Part one.", "Part two.", "Why?"], "messages")
    assert found == Found("Part one.\n\nPart two.", "Why?", "messages")


def test_field_takes_the_question_from_the_field_or_the_last_user_message():
    assert find_question(["Why?"], "field", field_document="Doc.") == Found("Doc.", "Why?", "field")
    found = find_question(["ignored"], "field", field_document="Doc.", field_question="How?")
    assert found == Found("Doc.", "How?", "field")


def test_auto_chooses_field_then_messages_then_split():
    assert find_question(["Why?"], "auto", field_document="Doc.").mode == "field"
    assert find_question(["Doc.", "Why?"], "auto").mode == "messages"
    assert find_question(["Doc.\n\nWhy?"], "auto").mode == "split"


@pytest.mark.parametrize(
    ("texts", "mode", "marker", "said"),
    [
        ([], "split", None, "there is none"),
        (["one line"], "split", None, "no blank line"),
        (["Doc.\n\n   "], "split", None, "no blank line"),  # trailing blanks are not a split
        (["Doc. Why?"], "split", "Question:", "does not contain it"),
        (["Doc. Question:  "], "split", "Question:", "the text after the split is empty"),
        (["Why?"], "messages", None, "found no document"),
        ([], "messages", None, "no user message"),
        (["Doc.", ""], "messages", None, "last user message is empty"),
        (["Why?"], "field", None, "memagent.document, which is missing"),
        ([], "auto", None, "there is none"),
    ],
)
def test_each_mode_says_what_it_looked_for(texts, mode, marker, said):
    with pytest.raises(QuestionError) as err:
        find_question(texts, mode, marker)
    assert said in str(err.value)


def test_field_without_any_question():
    with pytest.raises(QuestionError) as err:
        find_question([], "field", field_document="Doc.")
    assert "has neither" in str(err.value)
