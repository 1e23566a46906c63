"""A reply sent without a Content-Length (chunked) is bounded by what has arrived in all (recurrent/replies.py): a
server that sends a reply of many small chunks, each under the call's bound and all together over it, is cut off
once their sum passes it."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from threaded_http import serve_in_a_thread

from recurrent.client import ChatRequestError, OpenAIChatClient
from recurrent.replies import reply_byte_limit

CHUNK = 16 * 1024  # each piece well under the bound of a 1-token call (64 KiB + 384 bytes)


def completion(content: str) -> bytes:
    choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
    return json.dumps({"id": "x", "object": "chat.completion", "choices": [choice], "usage": {}}).encode()


@pytest.fixture
def chunked():
    """A chat endpoint that sends each reply in chunks of 16 KiB, no Content-Length; its content: ``state[0]``."""
    state = ["ok"]

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        body = completion(state[0])
        for start in range(0, len(body), CHUNK):
            await response.write(body[start : start + CHUNK])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    with serve_in_a_thread(app, 10) as url:
        yield url, state


@pytest.mark.timeout(30)
async def test_a_chunked_reply_over_its_calls_bound_is_refused(chunked):
    url, state = chunked
    limit = reply_byte_limit(1)
    assert limit == 64 * 1024 + 1 * 64 * 6  # the reply's fields, and one token of at most 64 characters, 6 bytes each
    async with OpenAIChatClient(url, "m", api_key="k", max_retries=0) as client:
        reply = await client.chat([{"role": "user", "content": "hi"}], 1)  # a small chunked reply is read
        assert reply.text == "ok"
        state[0] = "x" * (5 * CHUNK)  # five chunks and more: every one under the bound, their sum over it
        with pytest.raises(ChatRequestError) as raised:
            await client.chat([{"role": "user", "content": "hi"}], 1)
    assert f"passed {limit:,} bytes, the most its call allows" in str(raised.value)
