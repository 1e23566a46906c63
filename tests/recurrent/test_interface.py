"""The contract's helpers (recurrent/interface.py): a row's question."""

from __future__ import annotations

import pytest

from recurrent.interface import question_text


def test_the_question_is_a_string_or_the_last_user_message_of_a_chat():
    assert question_text({"prompt": "Why?"}, "prompt") == "Why?"
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "1"},
        {"role": "user", "content": "last"},
    ]
    assert question_text({"prompt": chat}, "prompt") == "last"


def test_a_row_without_its_question_is_refused_naming_the_column():
    with pytest.raises(KeyError, match="sample has no column 'question'"):
        question_text({"prompt": "x"}, "question")
    with pytest.raises(ValueError, match="column 'prompt' holds a chat list without a user message"):
        question_text({"prompt": [{"role": "system", "content": "s"}]}, "prompt")
