"""Tool calls in the Qwen family's format (Hermes): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in
the reply text, read the way vLLM's ``hermes`` tool parser reads a finished reply, so an agent behaves the same in
training (the recording route: recurrent/openai_route.py) as behind ``vllm serve --tool-call-parser hermes``.

vLLM's rules (``Hermes2ProToolParser.extract_tool_calls`` and the ``DelegatingParser`` around it):

- no ``<tool_call>`` in the text: no calls, the text is the content;
- every ``<tool_call>...</tool_call>`` (and a last one left open at the end of the text) is one call; its body is
  JSON with a string ``name`` and any ``arguments``, which come back re-serialized (``json.dumps``, non-ASCII kept);
- one malformed call (bad JSON, no name or arguments, not an object) and the whole reply is text, with no calls;
- the content is the text before the first ``<tool_call>``, None when empty or only whitespace; text after the
  calls is dropped.

Conversations are written back for the chat template as vLLM does: an assistant turn's tool-call arguments as
objects, not JSON strings, and a missing content as "". A template that cannot render tools (the tiny CPU model's)
gets them as text in the same format (:func:`as_text_messages`), so a tools-API agent trains on it too
(docs/write_your_own_agent.md, "Bring the agent you have").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

START, END = "<tool_call>", "</tool_call>"
_CALLS = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: its function's name and its arguments as a JSON string (the OpenAI wire format)."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ParsedReply:
    """A reply split as vLLM splits it: the content (None when there is none) and the calls (empty: none)."""

    content: str | None
    calls: tuple[ToolCall, ...]


def parse_tool_calls(text: str) -> ParsedReply:
    """The content and tool calls of a finished reply, by vLLM's hermes rules (module docstring)."""
    if START not in text:
        return ParsedReply(text, ())
    try:
        bodies = [json.loads(closed or open_) for closed, open_ in _CALLS.findall(text)]
        calls = tuple(_call(body) for body in bodies)
    except (ValueError, KeyError, TypeError):
        return ParsedReply(text, ())  # vLLM: a reply with any malformed call is all text
    content = text[: text.find(START)]
    return ParsedReply(content if content.strip() else None, calls)


def _call(body: Any) -> ToolCall:
    name = body["name"]  # a list or a string body raises TypeError here, as in vLLM
    if not isinstance(name, str):  # vLLM's FunctionCall(name: str) refuses it
        raise TypeError("a tool call's name must be a string")
    return ToolCall(name, json.dumps(body["arguments"], ensure_ascii=False))


def call_text(name: str, arguments: Any) -> str:
    """One call written in the format (compact, as the calculator's warm start writes it)."""
    return START + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + END


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as vLLM hands them to a chat template: tool-call arguments parsed from their JSON strings (an
    empty or null one becomes ``{}``), an empty list of calls dropped, a missing content "", a content of text parts
    one text. Copies: the agent's messages are left as they were."""
    out = []
    for message in messages:
        message = dict(message)
        content = message.get("content")
        if content is None:
            message["content"] = ""
        elif isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            message["content"] = "\n".join(p.get("text", "") for p in content)  # text parts, joined as vLLM does
        if message.get("role") == "assistant" and "tool_calls" in message:
            calls = [_template_call(call) for call in message.get("tool_calls") or []]
            if calls:
                message["tool_calls"] = calls
            else:
                message.pop("tool_calls")
        out.append(message)
    return out


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str) and arguments:
        parsed = json.loads(arguments)
        arguments = parsed if parsed is not None else {}
    function["arguments"] = arguments or {}
    return {**call, "function": function}


def as_text_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`template_messages` for a chat template without tool support: an assistant turn's calls appended to its
    content in the format, a tool result as a user turn ``<tool_response>...</tool_response>``."""
    out = []
    for message in template_messages(messages):
        if message.get("role") == "assistant" and "tool_calls" in message:
            calls = "".join(call_text(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"])
            message = {"role": "assistant", "content": message["content"] + calls}
        elif message.get("role") == "tool":
            message = {"role": "user", "content": f"<tool_response>{message['content']}</tool_response>"}
        out.append(message)
    return out


def renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders tool calls itself (Qwen2.5's and Qwen3's do)."""
    return "tool_calls" in str(getattr(tokenizer, "chat_template", None) or "")
