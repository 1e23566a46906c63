"""An agent written against the ``openai`` client (experiments/calculator/openai_agent.py) serves behind the endpoint
unmodified: its requests reach the upstream with their tools and tool messages, a progress event per call, and the
answer is its last reply."""

from __future__ import annotations

import json
import re

from aiohttp import web
from serve_helpers import WAIT, served
from test_serve_agents import read_stream
from threaded_http import serve_in_a_thread

QUESTION = re.compile(r"What is (\d+) \* (\d+)\?")


def tools_app(seen: list[dict]) -> web.Application:
    """The model: a question gets a calculator call in the text, a tool result gets boxed."""

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        last = body["messages"][-1]
        if last["role"] == "tool":
            text = f"The result is \\boxed{{{last['content']}}}"
        else:
            a, b = QUESTION.search(last["content"]).groups()
            text = (
                f"<tool_call>{json.dumps({'name': 'calculate', 'arguments': {'expression': f'{a} * {b}'}})}</tool_call>"
            )
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        return web.json_response(
            {"id": "x", "object": "chat.completion", "model": "m", "choices": [choice], "usage": usage}
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


def test_the_openai_calculator_serves_and_streams_a_progress_event_per_call():
    seen: list[dict] = []
    request = {"messages": [{"role": "user", "content": "What is 37 * 48?"}]}
    with (
        serve_in_a_thread(tools_app(seen), wait_s=WAIT) as url,
        served(url, "m", None, agent="calculator_openai") as (base, _),
    ):
        progress, _, answer, summary = read_stream(base, request, data=True)
    assert [(p["agent"], p["call"]) for p in progress] == [("calculator_openai", 1), ("calculator_openai", 2)]
    assert answer == "The result is \\boxed{1776}" and summary == {"agent": "calculator_openai", "turns": 2}
    assert seen[0]["tools"][0]["function"]["name"] == "calculate"
    assert seen[1]["messages"][-1] == {"role": "tool", "tool_call_id": "call_0_0", "content": "1776"}
