"""A scripted OpenAI-compatible "model" for the calculator agent (experiments/calculator/agent.py): a question gets a
calculator call on its operands, a tool result gets that result boxed. The agent's own calculator computes the
answer, so a run is right exactly when the agent's tool loop works."""

from __future__ import annotations

import re

from aiohttp import web

QUESTION = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")
RESULT = re.compile(r"<tool_response>(.*)</tool_response>")


QUESTION = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")
RESULT = re.compile(r"<tool_response>(.*)</tool_response>")


def calculator_app(seen: list[list[dict]]) -> web.Application:
    """The model: a question gets a calculator call on its operands; a tool result gets the result boxed."""

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        messages = body["messages"]
        seen.append(messages)
        last = messages[-1]["content"]
        if result := RESULT.search(last):
            text = f"The result is \\boxed{{{result.group(1)}}}"
        else:
            a, op, b = QUESTION.search(last).groups()
            text = f'<tool_call>{{"name": "calculate", "arguments": {{"expression": "{a} {op} {b}"}}}}</tool_call>'
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app
