"""The front of ``python -m recurrent.local_server`` (recurrent/local_front.py): ``n`` completions as ``n``
requests made at once and one completion with choices 0..n-1; a bad ``n`` refused; the rest passed through."""

from __future__ import annotations

import asyncio

import httpx2  # the openai package's HTTP library
import pytest
from aiohttp import web
from threaded_http import serve_in_a_thread

from recurrent.local_front import front_app, merged
from recurrent.openai_route import MAX_COMPLETIONS

WAIT = 30.0


def counting_model(seen: list[dict]) -> web.Application:
    """A model whose k-th request (from 1) is answered ``reply k``, 5 prompt and k completion tokens."""

    async def chat(request: web.Request) -> web.Response:
        seen.append(await request.json())
        k = len(seen)
        choice = {"index": 0, "message": {"role": "assistant", "content": f"reply {k}"}, "finish_reason": "stop"}
        usage = {"prompt_tokens": 5, "completion_tokens": k, "total_tokens": 5 + k}
        return web.json_response({"id": f"c{k}", "object": "chat.completion", "choices": [choice], "usage": usage})

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    return app


def post_all(front, bodies: list[dict]) -> list[httpx2.Response]:
    async def go() -> list[httpx2.Response]:
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=front), base_url="http://front") as client:
            replies = [await client.post("/v1/chat/completions", json=body) for body in bodies]
            replies.append(await client.get("/v1/models"))
            return replies

    return asyncio.run(go())


@pytest.mark.timeout(60)
def test_n_completions_are_n_requests_and_one_answer_with_n_choices():
    seen: list[dict] = []
    ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    with serve_in_a_thread(counting_model(seen), wait_s=WAIT) as url:
        front = front_app(url.removesuffix("/v1"), {"temperature": 0.7, "top_p": 0.95})
        three, one, bad, streamed, listed = post_all(
            front, [{**ask, "n": 3, "temperature": 1.0}, ask, {**ask, "n": 0}, {**ask, "n": 2, "stream": True}]
        )
    body = three.json()
    assert three.status_code == 200 and [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert sorted(c["message"]["content"] for c in body["choices"]) == ["reply 1", "reply 2", "reply 3"]
    # the prompt counted once (5), the completions of all three (1 + 2 + 3)
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}
    # each of the three sent without n, at its own temperature and the rule's top_p 1.0; then one that set neither
    assert [("n" in s, s["temperature"], s["top_p"]) for s in seen] == [(False, 1.0, 1.0)] * 3 + [(False, 0.7, 0.95)]
    assert one.json()["choices"][0]["message"]["content"] == "reply 4"
    assert bad.status_code == 400 and f"n must be an integer in [1, {MAX_COMPLETIONS}], got 0" in bad.text
    assert streamed.status_code == 400 and "stream" in streamed.json()["error"]["message"]
    assert len(seen) == 4  # the refused ones never reached the model
    assert listed.json()["data"][0]["id"] == "m"  # everything else passes through


def test_merged_numbers_the_choices_in_order():
    replies = [
        {
            "id": "a",
            "choices": [{"index": 0, "message": {"content": "x"}}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 1},
        },
        {
            "id": "b",
            "choices": [{"index": 0, "message": {"content": "y"}}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 4},
        },
    ]
    out = merged(replies)
    assert out["id"] == "a" and [(c["index"], c["message"]["content"]) for c in out["choices"]] == [(0, "x"), (1, "y")]
    assert out["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
