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


def test_a_package_on_sys_path_registers_its_agents_and_leaving_the_path_unregisters_them(tmp_path, monkeypatch):
    """The registry is read once per ``sys.path`` (a scan opens every package's metadata): a package whose folder
    joins the path is seen at once, and gone when the folder leaves it."""
    from recurrent import interface

    dist = tmp_path / "someones_agents-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: someones-agents\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[recurrent.agents]\nreviewer = someones_agents.review:REGISTER\n")
    assert "reviewer" not in interface.registered_agents()
    assert interface.registered_spec("memory") == "recurrent.impls.memory:REGISTER"
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "reviewer" in interface.registered_agents() and "memory" in interface.registered_agents()
    assert interface.registered_spec("reviewer") == "someones_agents.review:REGISTER"
    monkeypatch.undo()
    assert interface.registered_spec("reviewer") is None and "reviewer" not in interface.registered_agents()
