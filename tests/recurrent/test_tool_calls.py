"""Tool calls in the Qwen family's format, read as vLLM's hermes parser reads them (recurrent/tool_calls.py): each
hand-written reply of tests/hermes_cases.py gives the content and calls pinned there; conversations are handed to a
chat template as vLLM hands them, or written as text for a template without tool support."""

from __future__ import annotations

import pytest
from hermes_cases import CASES

from recurrent.tool_calls import ParsedReply, ToolCall, as_text_messages, parse_tool_calls, template_messages


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_reply_parses_as_vllms_hermes_parser_parses_it(name):
    text, content, calls = CASES[name]
    expected = ParsedReply(content, tuple(ToolCall(*call) for call in calls or ()))
    assert parse_tool_calls(text) == expected


CALLED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "calculate", "arguments": '{"x": "1 + 2"}'}}],
}


def test_messages_reach_the_template_as_vllm_hands_them():
    messages = [{"role": "user", "content": "q"}, CALLED, {"role": "tool", "tool_call_id": "c0", "content": "3"}]
    shaped = template_messages(messages)
    assert shaped[1] == {
        **CALLED,
        "content": "",
        "tool_calls": [{**CALLED["tool_calls"][0], "function": {"name": "calculate", "arguments": {"x": "1 + 2"}}}],
    }
    assert shaped[0] == messages[0] and shaped[2] == messages[2]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == '{"x": "1 + 2"}'  # the agent's own left alone
    empty = {"role": "assistant", "content": "hi", "tool_calls": []}
    assert template_messages([empty]) == [{"role": "assistant", "content": "hi"}]  # vLLM drops an empty list
    parts = {"role": "tool", "content": [{"type": "text", "text": "3"}, {"type": "text", "text": "4"}]}
    assert template_messages([parts]) == [{"role": "tool", "content": "3\n4"}]  # OpenAI's parts, as one text
    null = {**CALLED, "tool_calls": [{"function": {"name": "f", "arguments": ""}}]}
    assert template_messages([null])[0]["tool_calls"][0]["function"]["arguments"] == {}


def test_without_tool_support_calls_and_results_are_written_in_the_format():
    messages = [
        {"role": "user", "content": "q"},
        {**CALLED, "content": "Let me see. "},
        {"role": "tool", "tool_call_id": "c0", "content": "3"},
    ]
    assert as_text_messages(messages) == [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": 'Let me see. <tool_call>{"name": "calculate", "arguments": {"x": "1 + 2"}}</tool_call>',
        },
        {"role": "user", "content": "<tool_response>3</tool_response>"},
    ]
