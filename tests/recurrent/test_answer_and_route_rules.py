"""Tests for what the last mutation round's survivors changed in the framework's core (issue 47): the recording
route's answer of a reply without content, its token cap when a request gives both, the finish reason of a reply
with tool calls; the one rule that an answer is the last call's reply (not any call's), and the prompt ids a token
backend rendered kept on the call's record."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from recurrent.async_manager import check_finished, run_session
from recurrent.functions import AnswerNotLastReplyError, CallRecorder, agent_function
from recurrent.interface import Reply
from recurrent.openai_agents import openai_agent

CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "6 * 7"}}</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "calculate", "parameters": {"type": "object"}}}]


class Upstream:
    """An OpenAI-style client (evaluation): records each call's cap, answers in order."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.caps: list[int] = []

    async def chat(self, messages, max_tokens, **options) -> Reply:
        self.caps.append(max_tokens)
        return Reply(self.replies.pop(0), "stop", prompt_tokens=5, completion_tokens=2)


@dataclass
class Empty:
    pass


SEEN: list = []


async def content_or_empty(sample, client, config):
    """One call with tools whose reply is only a tool call: its content is None, and the agent returns ``""``."""
    completion = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "6*7?"}], max_tokens=9, tools=TOOLS
    )
    SEEN.append(completion)
    return completion.choices[0].message.content or ""


async def both_caps(sample, client, config):
    completion = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=16, max_completion_tokens=8
    )
    return completion.choices[0].message.content


def run_openai(agent, replies: list[str]):
    register = openai_agent("probe", Empty, agent)
    episode = register.for_inference(None).episode({})
    upstream = Upstream(replies)
    asyncio.run(run_session(episode, upstream))
    check_finished(episode)
    return episode, upstream


def test_a_reply_that_is_only_a_tool_call_has_content_none_and_finish_reason_tool_calls():
    SEEN.clear()
    episode, _ = run_openai(content_or_empty, [CALL])
    message = SEEN[0].choices[0]
    assert message.message.content is None and message.message.tool_calls[0].function.name == "calculate"
    assert message.finish_reason == "tool_calls"  # vLLM's, whenever its parser found calls
    # The agent returned "" for that reply's None content: its answer is the reply's whole text.
    assert episode.answer == CALL == episode.history[-1].reply.text


def test_max_completion_tokens_wins_over_max_tokens():
    episode, upstream = run_openai(both_caps, ["ok"])
    assert upstream.caps == [8] and episode.history[0].turn.max_tokens == 8


@dataclass
class Calls:
    answer_with: int = 0  # the call whose reply the agent returns


async def two_calls(sample, client, config):
    replies = [await client.chat([{"role": "user", "content": f"call {i}"}], 4) for i in range(2)]
    return replies[config.answer_with].text


def test_an_answer_that_is_an_earlier_calls_reply_is_refused():
    register = agent_function("two", Calls, two_calls)
    episode = register.for_inference(None, answer_with=0).episode({})
    asyncio.run(run_session(episode, Upstream(["first", "second"])))
    with pytest.raises(AnswerNotLastReplyError, match="it returned 'first', its last reply was 'second'"):
        check_finished(episode)


class TokenBackend:
    """A token backend that renders the messages itself (as training's does when an agent sends no ids)."""

    async def chat(self, messages, max_tokens, **options) -> Reply:
        return Reply("ok", "stop", [7, 8], 3, 2, prompt_ids=[1, 2, 3])


def test_a_call_without_prompt_ids_records_the_ids_the_backend_rendered():
    recorder = CallRecorder(TokenBackend())
    asyncio.run(recorder.chat([{"role": "user", "content": "hi"}], 4))
    assert recorder.history[0].turn.prompt_ids == [1, 2, 3]
