"""The recording route: an ``openai.AsyncOpenAI`` whose ``/v1/chat/completions`` is served in process by the
framework's recording client, so an agent written against the official client trains, evaluates and serves
unmodified (docs/write_your_own_agent.md, "Bring the agent you have").

The client's HTTP transport is an ASGI app reached through ``httpx2.ASGITransport`` (the openai package's HTTP
library): no port, no network, the request handled in the agent's own task. Each request is one call of the
episode's :class:`~recurrent.functions.CallRecorder`, so each becomes one training row, and the reply is a real
``ChatCompletion`` built from the call's :class:`~recurrent.interface.Reply`:

- ``render`` given (training): the prompt is the messages and ``tools`` rendered by the tokenizer's chat template,
  sent to the rollout as ``prompt_ids``; the row's response is the ids the server sampled;
- ``render`` None (evaluation, serving): the messages, ``tools`` and ``tool_choice`` go to the upstream as they are.

Either way the reply's text is split into content and ``tool_calls`` by vLLM's hermes rules when the request has
tools (recurrent/tool_calls.py). ``n`` asks for that many completions: the route makes that many calls at once (each
one a row in training) and answers with one choice per call. Other request fields are sampling, handled by the run's
client as an agent's own sampling always is: in training ``temperature`` and ``top_p`` sample that call (its row
records them) and any other field is refused; in evaluation and serving they go upstream.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2  # the HTTP library of the openai package (a hard dependency of it)
from openai import AsyncOpenAI
from openai._base_client import get_platform

from recurrent.functions import CallRecorder
from recurrent.interface import Reply
from recurrent.tool_calls import parse_tool_calls

# (messages, tools, the most prompt tokens a call may have or None) -> prompt ids
Render = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, int | None], list[int]]
BASE_URL = "http://recording-route/v1"  # never resolved: the transport answers in process
PATH = "/v1/chat/completions"
# Fields the route itself reads; every other field of a request is the agent's sampling.
ROUTE_FIELDS = frozenset(
    {"model", "messages", "tools", "tool_choice", "max_tokens", "max_completion_tokens", "stream", "n"}
)
# The most completions one request may ask (``n``; OpenAI's API has the same bound): each is a model call made at
# once, so an unbounded n (10**6) held a million calls in memory before the first was answered.
MAX_COMPLETIONS = 128


class RouteError(Exception):
    """A request the route refuses: an HTTP status and a message, in OpenAI's error shape."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class RecordingRoute:
    """The ASGI app: ``POST /v1/chat/completions`` over one episode's recorder."""

    def __init__(self, recorder: CallRecorder, render: Render | None, default_max_tokens: int | None = None) -> None:
        self.recorder = recorder
        self.render = render
        self.default_max_tokens = default_max_tokens
        self.calls = 0
        self.last: tuple[str | None, str] | None = None  # the last completion's content and its reply's text

    def answer_text(self, answer: str) -> str:
        """The agent's answer as its last reply's text: an agent returns its last completion's ``content``, which
        for a reply with tool calls is only the text before them (empty: "" or None), while the reward scores the
        row's whole text (docs/write_your_own_agent.md). Any other answer is returned as it is (and refused)."""
        if self.last is not None and answer == (self.last[0] or ""):
            return self.last[1]
        return answer

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict]], send: Callable) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            if scope.get("method") != "POST" or scope.get("path") != PATH:
                raise RouteError(404, f"the recording route serves POST {PATH} only")
            status, payload = 200, await self.complete(json.loads(body))
        except RouteError as err:
            status, payload = err.status, _error(str(err), "invalid_request_error")
        except ValueError as err:  # the run's client refusing the request (sampling in training, a budget)
            status, payload = 400, _error(str(err), "invalid_request_error")
        except Exception as err:  # an upstream that failed for good: the agent gets the reason, never a retry
            status = getattr(err, "status_code", None) or 500
            payload = _error(f"{type(err).__name__}: {err}", "server_error")
        data = json.dumps(payload, ensure_ascii=False).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    async def complete(self, request: dict[str, Any]) -> dict[str, Any]:
        """One chat completion: the call made through the recorder, its reply in OpenAI's shape."""
        if request.get("stream"):
            raise RouteError(400, "stream: the recording route answers whole completions only")
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RouteError(400, "messages: a non-empty list of chat messages is required")
        max_tokens = request.get("max_completion_tokens") or request.get("max_tokens") or self.default_max_tokens
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise RouteError(400, "max_tokens (or max_completion_tokens): each call's cap on new tokens is required")
        n = request.get("n", 1) if request.get("n") is not None else 1
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise RouteError(400, f"n: the number of completions is an integer >= 1, got {n!r}")
        if n > MAX_COMPLETIONS:
            raise RouteError(400, f"n: the number of completions is at most {MAX_COMPLETIONS}, got {n:,}")
        tools = request.get("tools") or None
        sampling = {k: v for k, v in request.items() if k not in ROUTE_FIELDS}
        if request.get("tool_choice") not in (None, "auto"):
            sampling["tool_choice"] = request["tool_choice"]  # changes decoding: a sampling field (module docstring)
        if self.render is not None:
            sampling["prompt_ids"] = self.render(messages, tools, self.recorder.max_prompt_tokens)
        elif tools:
            sampling["tools"] = tools
        # Numbered as it arrives, so that requests made at once get ids of their own; each of its n calls records
        # the request and its choice (the rows and the trajectory carry them: docs/write_your_own_agent.md).
        number = self.calls
        self.calls += 1
        request_id = f"chatcmpl-recorded-{number}"
        # n completions are n calls made at once (one round in sync mode), each awaited before the answer
        results = await asyncio.gather(
            *(
                self.recorder.chat(messages, max_tokens, meta={"request": request_id, "choice": index}, **sampling)
                for index in range(n)
            ),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        parse = tools is not None and request.get("tool_choice") != "none"  # vLLM parses no calls under "none"
        return self.completion(results, str(request.get("model", "")), parse, number)

    def choice(self, index: int, reply: Reply, parse: bool, number: int) -> dict[str, Any]:
        """One choice of a completion (as vLLM answers): with tools, the text split into content and calls."""
        parsed = parse_tool_calls(reply.text) if parse else None
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        finish = reply.finish_reason
        if parsed is not None and parsed.calls:
            message["content"] = parsed.content
            message["tool_calls"] = [
                {
                    "id": f"call_{number}_{i}" if index == 0 else f"call_{number}_{index}_{i}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for i, c in enumerate(parsed.calls)
            ]
            finish = "tool_calls"  # vLLM: whenever the parser found calls
        self.last = (message["content"], reply.text)
        choice: dict[str, Any] = {"index": index, "message": message, "finish_reason": finish}
        if reply.token_ids is not None:  # vLLM's return_token_ids field: the ids the row holds
            choice["token_ids"] = list(reply.token_ids)
        return choice

    def completion(self, replies: list[Reply], model: str, parse: bool, number: int) -> dict[str, Any]:
        """A ``ChatCompletion`` with one choice per reply (the last one recorded is the episode's last call), the
        ``number``-th request of the episode."""
        choices = [self.choice(index, reply, parse, number) for index, reply in enumerate(replies)]
        prompt_tokens = replies[0].prompt_tokens
        completion_tokens = sum(reply.completion_tokens for reply in replies)
        completion: dict[str, Any] = {
            "id": f"chatcmpl-recorded-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        if replies[0].token_ids is not None:  # vLLM's return_token_ids field: the prompt ids the rows hold
            completion["prompt_token_ids"] = list(replies[0].prompt_ids or [])
        return completion


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def recording_client(route: RecordingRoute) -> AsyncOpenAI:
    """An ``AsyncOpenAI`` served by ``route`` in process. The SDK never retries: a failed call fails the agent's
    trajectory as any failed call does (docs/write_your_own_agent.md), and a retry would sample twice."""
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=route), base_url=BASE_URL)
    client = AsyncOpenAI(base_url=BASE_URL, api_key="recording-route", max_retries=0, http_client=http)
    # The SDK's first request on a client looks its platform up in a worker thread; in sync mode a call still in
    # that thread is invisible to the lockstep barrier, which could then close a round before every call an agent
    # made at once has joined it (docs/write_your_own_agent.md, "What the framework does for you"). Set here, the
    # requests stay on the event loop.
    client._platform = _process_platform()
    return client


@functools.cache
def _process_platform() -> Any:
    """The SDK's platform record, looked up once per process (it names the OS in request headers only)."""
    return get_platform()
