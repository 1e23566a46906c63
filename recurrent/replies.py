"""What the chat client accepts as a server's reply: its size bounded while it arrives, and its shape checked before
any of it is read (docs/serving.md, "What a request costs").

- **Size.** A reply to a call capped at ``max_tokens`` new tokens holds at most ``max_tokens`` tokens of text, each
  at most :data:`~recurrent.tokens.MAX_CHARS_PER_TOKEN` characters, each at most 6 bytes of JSON (a ``\\uXXXX``
  escape): :func:`reply_byte_limit` bytes with the reply's own fields. :func:`bound_reply`, a hook of the client's
  HTTP client, stops reading a reply (error bodies included) once it passes the limit of the call in progress and
  raises :class:`ReplyTooLargeError`: a faulty upstream that sends 100 MiB costs ~400 KB, not 100 MiB.
- **Shape.** :func:`reply_of` reads an OpenAI chat completion (``choices[0].message``, ``finish_reason``, ``usage``)
  and raises :class:`MalformedReplyError` naming the field for anything else: an HTML page, ``choices`` that is not
  a non-empty list of objects, a content that is not text (or holds a lone surrogate: no Unicode text), usage counts
  that are not integers.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2  # the HTTP library of the openai package (a hard dependency of it)
import openai

from recurrent.interface import FinishReason, Reply
from recurrent.tokens import MAX_CHARS_PER_TOKEN
from recurrent.tool_calls import call_text

REPLY_FIELDS_BYTES = 64 * 1024  # a reply's JSON besides its text: ids, usage, a server's extra fields
BYTES_PER_CHAR = 6  # the longest JSON form of one character of the text (a \uXXXX escape)
LISTING_BYTES = 4 * 1024 * 1024  # GET /models: a hosted API lists a few hundred models in ~100 KB
_LIMIT: contextvars.ContextVar[int] = contextvars.ContextVar("reply_limit", default=LISTING_BYTES)
_SURROGATE = re.compile("[\ud800-\udfff]")  # half of a UTF-16 pair, alone: what "\ud800" in JSON decodes to


class ReplyTooLargeError(openai.OpenAIError):
    """A reply over the size its call allows (an ``OpenAIError``: the SDK passes it on as it is, never retried)."""


class MalformedReplyError(ValueError):
    """A reply that is not an OpenAI chat completion; the message names the field at fault."""


def reply_byte_limit(max_tokens: int) -> int:
    """The most bytes a reply to a call capped at ``max_tokens`` new tokens may take (module docstring)."""
    return REPLY_FIELDS_BYTES + max_tokens * MAX_CHARS_PER_TOKEN * BYTES_PER_CHAR


@contextlib.contextmanager
def reply_limit(limit: int) -> Iterator[None]:
    """Replies read in this block (this task) may take at most ``limit`` bytes; elsewhere :data:`LISTING_BYTES`."""
    token = _LIMIT.set(limit)
    try:
        yield
    finally:
        _LIMIT.reset(token)


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, stream: httpx2.AsyncByteStream, limit: int, url: str) -> None:
        self.stream, self.limit, self.url = stream, limit, url

    async def __aiter__(self) -> AsyncIterator[bytes]:
        received = 0
        async for part in self.stream:
            received += len(part)
            if received > self.limit:
                raise ReplyTooLargeError(
                    f"the reply from {self.url} passed {self.limit:,} bytes, the most its call allows"
                )
            yield part

    async def aclose(self) -> None:
        await self.stream.aclose()


async def bound_reply(response: httpx2.Response) -> None:
    """An HTTP client's response hook: the reply stops at the limit of the call in progress (:func:`reply_limit`),
    by its Content-Length before it is read, else once that many bytes have arrived (whatever the transport: a
    proxy's too)."""
    limit, url = _LIMIT.get(), str(response.request.url.copy_with(query=None))
    length = response.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise ReplyTooLargeError(f"the reply from {url} is {int(length):,} bytes, over the {limit:,} its call allows")
    response.stream = _CappedStream(response.stream, limit, url)


def reply_of(response: Any, stop: Any, seconds: float) -> Reply:
    """The :class:`Reply` of an OpenAI chat completion; :class:`MalformedReplyError` for any other shape."""
    if not isinstance(response, dict):
        shown = response[:80] if isinstance(response, str) else type(response).__name__
        raise MalformedReplyError(f"the reply is not a JSON object: {shown!r}")
    choices = response.get("choices")
    if not choices:
        raise MalformedReplyError("the reply has no choices")
    if not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise MalformedReplyError(f"choices must be a list of objects, got {_kind(choices)}")
    choice = choices[0]
    message = choice.get("message") or {}
    if not isinstance(message, dict):
        raise MalformedReplyError(f"choices[0].message must be an object, got {_kind(message)}")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise MalformedReplyError(f"choices[0].message.content must be a string or null, got {_kind(content)}")
    calls = message.get("tool_calls")
    if calls is not None and not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
        raise MalformedReplyError(f"choices[0].message.tool_calls must be a list of objects, got {_kind(calls)}")
    usage = response.get("usage") or {}
    if not isinstance(usage, dict):
        raise MalformedReplyError(f"usage must be an object, got {_kind(usage)}")
    counts = [usage.get(name) or 0 for name in ("prompt_tokens", "completion_tokens")]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        raise MalformedReplyError(f"usage token counts must be integers >= 0, got {counts!r}")
    text = _reply_text(choice, content or "", stop) + _calls_text(calls)
    found = _SURROGATE.search(text)
    if found:
        raise MalformedReplyError(f"the reply's text holds a lone surrogate (U+{ord(found.group()):04X}): not Unicode")
    finish: FinishReason = "length" if choice.get("finish_reason") == "length" else "stop"
    return Reply(text=text, finish_reason=finish, prompt_tokens=counts[0], completion_tokens=counts[1], seconds=seconds)


def _kind(value: Any) -> str:
    shown = json.dumps(value, default=str)
    return f"{type(value).__name__} {shown if len(shown) <= 60 else shown[:57] + '...'}"


def _reply_text(choice: dict[str, Any], text: str, stop: Any) -> str:
    """The message content, plus the stop string that ended generation when the server reports it (vLLM's
    ``stop_reason``), so the stored text equals the generated tokens (as the fork's async path did;
    without it a tool call would lose its closing tag). Servers that do not report
    it (``transformers serve``, hosted APIs) leave the content as is."""
    matched = choice.get("stop_reason")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    finished = choice.get("finish_reason") == "stop"
    if finished and isinstance(matched, str) and matched in stops and not text.endswith(matched):
        text += matched
    return text


def _calls_text(calls: list[dict[str, Any]] | None) -> str:
    """Tool calls a server parsed out of the text (``vllm serve --tool-call-parser hermes``, hosted APIs), written
    back in the Qwen format after the content, where vLLM's parser took them from: the reply's text stays the
    model's, and the recording route reads the same calls out of it (recurrent/tool_calls.py)."""
    written = []
    for call in calls or []:
        function = call.get("function") or {}
        if not isinstance(function, dict):
            raise MalformedReplyError(f"a tool call's function must be an object, got {_kind(function)}")
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except (TypeError, ValueError):
            arguments = function.get("arguments")
        written.append(call_text(str(function.get("name", "")), arguments))
    return "".join(written)
