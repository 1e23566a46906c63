"""An OpenAI-compatible chat client for the async manager: bounded concurrency, timeouts, counted retries.

Works with any ``/v1/chat/completions`` endpoint: vLLM, ``transformers serve``, hosted services and Azure
deployment URLs (``https://host/openai/deployments/<name>``). Unlike the original evaluation client, which
never retried and turned a failed request into an empty answer that was then left out of the score, a failed
request is never turned into an empty answer: transient failures are retried with exponential backoff and,
once retries are exhausted, a :class:`ChatRequestError` is raised with the cause chained.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import httpx2  # the HTTP library of the openai package (a hard dependency of it)
import openai
from openai import AsyncOpenAI

from recurrent.interface import Reply
from recurrent.replies import (
    MalformedReplyError,
    ReplyTooLargeError,
    bound_reply,
    reply_byte_limit,
    reply_limit,
    reply_of,
)

log = logging.getLogger(__name__)

DEFAULT_URL = "http://localhost:8000/v1"
DEFAULT_API_KEY = "123-abc"  # the original quickstart's placeholder; local servers ignore it
MAX_BACKOFF = 60.0  # cap on one backoff sleep, in seconds
CONNECT_TIMEOUT = 60.0  # seconds to open a connection (the attempt's deadline bounds the rest)
CHARS_PER_TOKEN = 4  # to estimate a prompt's tokens without a tokenizer


_deadline = asyncio.timeout  # the project needs Python >= 3.11


class ChatRequestError(RuntimeError):
    """A chat request that failed for good: non-transient, or transient after the last retry.

    ``attempts`` is the number of HTTP requests made, ``status_code`` the last HTTP status (``None`` for
    connection errors and timeouts), ``transient`` whether the last failure was of a retryable kind.
    """

    def __init__(self, message: str, *, attempts: int, status_code: int | None, transient: bool) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.status_code = status_code
        self.transient = transient


@dataclass
class ClientStats:
    """Counters over the life of a client (the harness and the benchmarks read them)."""

    calls: int = 0  # chat() invocations
    requests: int = 0  # HTTP requests sent (attempts, retries included)
    retries: int = 0  # attempts after the first one of a call
    failures: int = 0  # calls that raised ChatRequestError
    prompt_tokens: int = 0  # from the server's usage of successful calls
    completion_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _split_url(base_url: str) -> tuple[str, dict[str, str]]:
    """Move a query string (Azure's ``?api-version=...``) out of the base URL: the openai client appends the
    path after the base URL, so a query left in it would end up in the middle of the request path."""
    parts = urlsplit(base_url)
    query = dict(parse_qsl(parts.query))
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", "")), query


def _is_transient(err: BaseException) -> bool:
    if isinstance(err, (openai.APIConnectionError, asyncio.TimeoutError)):  # APITimeoutError included
        return True
    if isinstance(err, openai.APIStatusError):
        return err.status_code == 429 or err.status_code >= 500
    return False


def _retry_after(err: BaseException) -> float | None:
    """Seconds the server asked us to wait (``Retry-After`` on 429/503), if it said so in seconds."""
    if not isinstance(err, openai.APIStatusError):
        return None
    try:
        return float(err.response.headers.get("retry-after", ""))
    except ValueError:
        return None


MAX_ERROR_CHARS = 1000  # of a server's error body quoted in a message


def _server_says(err: openai.APIStatusError) -> str:
    """What the server said, from the error body in any common shape: OpenAI's ``{"error": {"message"}}`` (the
    SDK's message has it already), FastAPI's ``{"detail": ...}`` (``transformers serve``), other JSON, or text.
    The SDK keeps only OpenAI's shape in its message, which leaves "Error code: 400" for the others."""
    body = err.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        said = inner.get("message") if isinstance(inner, dict) else inner
        if not said:
            said = body.get("detail") or body.get("message") or body
    else:
        said = body
    text = said if isinstance(said, str) else json.dumps(said, ensure_ascii=False, default=str) if said else ""
    return text[:MAX_ERROR_CHARS]


def _describe(err: BaseException) -> str:
    if isinstance(err, asyncio.TimeoutError):
        return "TimeoutError: no complete response in time"
    if isinstance(err, openai.APIStatusError):
        said = _server_says(err)
        message = err.message if not said or said in err.message else f"{err.message} - {said}"
        return f"{type(err).__name__} (HTTP {err.status_code}): {message}"
    return f"{type(err).__name__}: {err}"


@dataclass(frozen=True)
class UpstreamCheck:
    """What a health check of the upstream found (:meth:`OpenAIChatClient.check_upstream`): ``reachable`` when it
    answered anything (a hosted deployment URL may have no ``/models``: any HTTP status says it is up) or took the
    connection; ``busy`` when it took the connection but did not answer in time."""

    reachable: bool
    busy: bool = False
    status_code: int | None = None
    error: str | None = None


class OpenAIChatClient:
    """The :class:`~recurrent.interface.ChatClient` for HTTP endpoints, over ``openai.AsyncOpenAI``.

    ``base_url`` defaults to env ``URL`` then ``http://localhost:8000/v1``; ``api_key`` to env ``API_KEY`` then
    a placeholder. The key is sent both as a Bearer token and as an ``api-key`` header (Azure), as the original
    quickstart did, and is kept out of reprs, logs and error messages. At most ``max_concurrency`` requests are
    in flight; each attempt must finish within ``timeout + timeout_per_token * (max_tokens + prompt tokens)``
    seconds (prompt tokens estimated as characters / 4), so a long prompt or a long answer gets the time it
    needs and a short one does not wait an hour for a dead server; transient failures (connection errors,
    timeouts, HTTP 429 and 5xx) are retried ``max_retries`` times after ``backoff * 2**attempt`` seconds
    (capped at 60 s, longer if the server sends ``Retry-After``). ``default_sampling`` is merged under each
    call's sampling. ``token_limit_param`` names the field that carries ``max_tokens`` (OpenAI's o-series want
    ``max_completion_tokens``; ``transformers serve`` ignores that one). ``max_model_len``, when given, caps the
    tokens an attempt's timeout counts (no model reads or writes more than its context): the timeout then has a
    ceiling that no ``max_tokens`` lifts. A reply is read up to the size its ``max_tokens`` allows and must be a
    chat completion (recurrent/replies.py); either fault fails the call at once, not retried.
    """

    def __init__(
        self,
        base_url: str | None,
        model: str,
        api_key: str | None = None,
        max_concurrency: int = 64,
        timeout: float = 600.0,
        timeout_per_token: float = 0.0,
        max_retries: int = 3,
        backoff: float = 1.0,
        default_sampling: dict[str, Any] | None = None,
        extra_headers: dict[str, str] | None = None,
        token_limit_param: str = "max_tokens",
        max_model_len: int | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.base_url, self._query = _split_url(base_url or os.environ.get("URL") or DEFAULT_URL)
        self.model = model
        self.max_concurrency = max_concurrency
        self.timeout = timeout
        self.timeout_per_token = timeout_per_token
        self.max_retries = max_retries
        self.backoff = backoff
        self.default_sampling = dict(default_sampling or {})
        self.token_limit_param = token_limit_param
        self.max_model_len = max_model_len
        self._api_key = api_key or os.environ.get("API_KEY") or DEFAULT_API_KEY
        self._headers = {**(extra_headers or {}), "api-key": self._api_key}
        self.stats = ClientStats()
        # The HTTP client and the semaphore belong to one event loop; a new loop (a second asyncio.run from
        # run_sessions) gets fresh ones instead of failing on the closed loop's connections.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._openai: AsyncOpenAI | None = None
        self._health: AsyncOpenAI | None = None  # the health check's own connection (check_upstream)
        self._semaphore: asyncio.Semaphore | None = None

    def __repr__(self) -> str:  # no key here, ever
        return (
            f"OpenAIChatClient(base_url={self.base_url!r}, model={self.model!r}, "
            f"max_concurrency={self.max_concurrency}, timeout={self.timeout}, max_retries={self.max_retries})"
        )

    def _bind(self) -> tuple[AsyncOpenAI, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._openai is None or self._semaphore is None or self._loop is not loop:
            # No read timeout below: a non-streamed reply is one long read; the attempt's deadline bounds it.
            io_timeout = httpx2.Timeout(None, connect=min(self.timeout, CONNECT_TIMEOUT))
            self._openai = self._sdk(self.max_concurrency, io_timeout)
            self._health = None
            self._semaphore = asyncio.Semaphore(self.max_concurrency)
            self._loop = loop
        return self._openai, self._semaphore

    def _sdk(self, connections: int, timeout: httpx2.Timeout) -> AsyncOpenAI:
        """An SDK client over a pool of ``connections``, its replies bounded in size (recurrent/replies.py)."""
        limits = httpx2.Limits(max_connections=connections, max_keepalive_connections=connections)
        hooks = {"response": [bound_reply]}
        return AsyncOpenAI(
            base_url=self.base_url,
            api_key=self._api_key,
            timeout=timeout,
            max_retries=0,  # retries are ours: counted, logged, and classified the same for every server
            default_headers=self._headers,
            default_query=self._query or None,
            http_client=httpx2.AsyncClient(limits=limits, timeout=timeout, event_hooks=hooks),
        )

    async def aclose(self) -> None:
        """Close the HTTP connections of the current event loop (the next call opens new ones)."""
        if self._loop is asyncio.get_running_loop():
            for sdk in (self._openai, self._health):
                if sdk is not None:
                    await sdk.close()
        self._openai, self._health, self._semaphore, self._loop = None, None, None, None

    async def __aenter__(self) -> OpenAIChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _request(self, messages: list[dict[str, str]], max_tokens: int, sampling: dict[str, Any]) -> dict[str, Any]:
        if sampling.get("n", 1) != 1:
            raise ValueError("one reply per call: sampling n must be 1")
        # Every sampling key goes into the JSON body as is (top_k, min_p, ... reach vLLM unchanged).
        request = {k: v for k, v in sampling.items() if k != "n"}
        request.update(model=self.model, messages=messages, **{self.token_limit_param: max_tokens})
        return request

    def attempt_timeout(self, messages: list[dict[str, str]], max_tokens: int) -> float:
        """Seconds one attempt of this request may take."""
        prompt_tokens = sum(len(str(m.get("content") or "")) for m in messages) // CHARS_PER_TOKEN
        tokens = max_tokens + prompt_tokens
        if self.max_model_len is not None:
            tokens = min(tokens, self.max_model_len)
        return self.timeout + self.timeout_per_token * tokens

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    async def chat(
        self, messages: list[dict[str, str]], max_tokens: int, *, prompt_ids: list[int] | None = None, **sampling: Any
    ) -> Reply:
        """One chat completion. ``sampling``: temperature, top_p, seed, stop, ... (merged over the defaults).
        ``prompt_ids`` is ignored: the endpoint applies its chat template to ``messages`` itself."""
        client, semaphore = self._bind()
        sampling = {**self.default_sampling, **sampling}
        request = self._request(messages, max_tokens, sampling)
        deadline = self.attempt_timeout(messages, max_tokens)
        self.stats.calls += 1
        attempt = 0
        while True:
            async with semaphore:  # held for the request only, not during the backoff sleep
                self.stats.requests += 1
                start = time.perf_counter()
                try:
                    # The deadline bounds the whole attempt (httpx's timeout alone bounds each read). It runs
                    # the request in this task: asyncio.wait_for on Python 3.11 runs it in another task and
                    # can drop a cancellation that arrives just as the reply does, so a stopped run reads on.
                    # A raw POST parsed as plain JSON: the SDK's request transforms and response models cost
                    # ~0.5 ms a call; its transport, errors and headers are the same.
                    with reply_limit(reply_byte_limit(max_tokens)):
                        async with _deadline(deadline):
                            response = await client.post("/chat/completions", body=request, cast_to=object)
                    error = None
                except (TimeoutError, openai.APIError, ReplyTooLargeError) as err:
                    error = err
                except ValueError as err:  # a body said to be JSON that is not (an HTML error page)
                    raise self._malformed(f"not JSON ({err})", attempt + 1) from err
                seconds = time.perf_counter() - start
            if error is None:
                return self._to_reply(response, sampling.get("stop"), seconds, attempt + 1)
            transient = _is_transient(error)
            if not transient or attempt >= self.max_retries:
                raise self._failure(error, attempt + 1, transient) from error
            delay = min(self.backoff * 2**attempt, MAX_BACKOFF)
            delay = max(delay, min(_retry_after(error) or 0.0, MAX_BACKOFF))
            log.warning(
                "%s; retry %d/%d in %.2f s", self._redact(_describe(error)), attempt + 1, self.max_retries, delay
            )
            self.stats.retries += 1
            attempt += 1
            await asyncio.sleep(delay)

    async def check_upstream(self, timeout: float = 5.0) -> UpstreamCheck:
        """``GET /models`` on a connection of its own (a health check: never queued behind the chat calls, one
        attempt, each phase within ``timeout`` seconds): whether the upstream answered, is busy (it took the
        connection but did not answer in time) or is unreachable (no connection)."""
        if self._health is None or self._loop is not asyncio.get_running_loop():
            self._bind()
            self._health = self._sdk(1, httpx2.Timeout(timeout))
        try:
            async with _deadline(2 * timeout):  # connecting, then answering: each within timeout
                await self._health.get("/models", cast_to=object)
        except ValueError:  # it answered, with a body that is not JSON: up
            return UpstreamCheck(reachable=True)
        except (TimeoutError, openai.APIError, ReplyTooLargeError) as err:
            connected = isinstance(err, TimeoutError) or not isinstance(
                err.__cause__, httpx2.ConnectTimeout | httpx2.ConnectError
            )
            status = getattr(err, "status_code", None)
            answered = status is not None or isinstance(err, ReplyTooLargeError)
            busy = not answered and connected and isinstance(err, TimeoutError | openai.APITimeoutError)
            message = self._redact(f"GET /models at {self.base_url}: {_describe(err)}")
            return UpstreamCheck(reachable=answered or busy, busy=busy, status_code=status, error=message)
        return UpstreamCheck(reachable=True)

    def _failure(
        self, error: BaseException, attempts: int, transient: bool, what: str = "chat request"
    ) -> ChatRequestError:
        self.stats.failures += 1
        # A server may echo the key in its error body ("invalid key sk-..."): scrub the chained cause too, since
        # tracebacks print it.
        if self._api_key and self._api_key in str(error):
            error.args = tuple(self._redact(a) if isinstance(a, str) else a for a in error.args)
            if isinstance(getattr(error, "message", None), str):
                error.message = self._redact(error.message)  # type: ignore[attr-defined]
        outcome = f"failed after {attempts} attempt{'s' * (attempts != 1)}" if transient else "failed (not retried)"
        message = self._redact(f"{what} to {self.base_url} {outcome}: {_describe(error)}")
        status = getattr(error, "status_code", None)
        return ChatRequestError(message, attempts=attempts, status_code=status, transient=transient)

    def _malformed(self, what: str, attempts: int) -> ChatRequestError:
        """The failure of a reply that is not a chat completion: the upstream's fault, not retried (the endpoint's
        502 ``upstream_bad_response``)."""
        self.stats.failures += 1
        message = self._redact(f"chat request to {self.base_url} returned a malformed reply: {what}")
        return ChatRequestError(message, attempts=attempts, status_code=None, transient=False)

    def _to_reply(self, response: Any, stop: Any, seconds: float, attempts: int) -> Reply:
        try:
            reply = reply_of(response, stop, seconds)
        except MalformedReplyError as err:
            raise self._malformed(str(err), attempts) from err
        self.stats.prompt_tokens += reply.prompt_tokens
        self.stats.completion_tokens += reply.completion_tokens
        return reply
