"""OpenAIChatClient over real sockets: a real `transformers serve` with the tiny model, and a small local
OpenAI-style HTTP server written here (aiohttp, in a thread) that fails, refuses, hangs or sleeps on demand."""

import asyncio
import gc
import logging
import time
import traceback
import warnings

import openai
import pytest
from aiohttp import web
from threaded_http import serve_in_a_thread

from recurrent.async_manager import run_session
from recurrent.client import ChatRequestError, OpenAIChatClient
from recurrent.functions import FunctionEpisode
from recurrent.interface import WorkflowConfig
from recurrent.local_server import free_port

SECRET = "sk-test-SECRET-7f3a9c"
HELLO = [{"role": "user", "content": "hello"}]


class FakeOpenAI:
    """A chat-completions endpoint whose behaviour each test sets: fail the first ``fail_first`` requests with
    ``status``, ``hang`` forever, or sleep ``delay`` seconds; it records every request and the peak in-flight."""

    def __init__(self) -> None:
        self.fail_first = 0
        self.status = 500
        self.retry_after: str | None = None
        self.hang = False
        self.delay = 0.0
        self.choice_extra: dict = {}
        self.content = "fake reply"
        self.error_body: dict | str | None = None  # instead of OpenAI's {"error": {"message": ...}}
        self.requests: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(
            {"path": request.path, "query": dict(request.query), "headers": dict(request.headers), "body": body}
        )
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.hang:
                await asyncio.sleep(3600)
            await asyncio.sleep(self.delay)
            if len(self.requests) <= self.fail_first:
                headers = {"Retry-After": self.retry_after} if self.retry_after else None
                message = f"injected failure for key {request.headers.get('api-key')}"  # a server echoing the key
                if isinstance(self.error_body, str):
                    return web.Response(text=self.error_body, status=self.status, headers=headers)
                body = self.error_body or {"error": {"message": message}}
                return web.json_response(body, status=self.status, headers=headers)
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": self.content},
                "finish_reason": "stop",
                **self.choice_extra,
            }
            return web.json_response(
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body["model"],
                    "choices": [choice],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
                }
            )
        finally:
            self.in_flight -= 1


@pytest.fixture
def fake():
    """The fake endpoint on 127.0.0.1 (a free port), served from its own thread and event loop."""
    state = FakeOpenAI()
    app = web.Application()
    app.router.add_post("/{tail:.*}", state.handle)
    with serve_in_a_thread(app, 10) as url:
        state.url = url
        yield state


@pytest.fixture
async def make_client():
    """Build clients for the fake (fast backoff, the test key); their connections are closed after the test."""
    made: list[OpenAIChatClient] = []

    def make(url: str, **kwargs) -> OpenAIChatClient:
        made.append(OpenAIChatClient(url, "fake-model", **{"api_key": SECRET, "backoff": 0.01, **kwargs}))
        return made[-1]

    yield make
    for client in made:
        await client.aclose()


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        assert SECRET not in text


async def test_real_server_reply_usage_length_and_greedy(tiny_server):
    client = OpenAIChatClient(tiny_server.base_url, tiny_server.model)
    first = await client.chat(HELLO, 4, temperature=0)
    second = await client.chat(HELLO, 4, temperature=0)
    assert first.finish_reason == "length"  # max_tokens hit
    assert first.completion_tokens == 4 and first.prompt_tokens > 0
    assert first.seconds > 0
    assert (first.text, first.completion_tokens) == (second.text, second.completion_tokens)  # greedy
    assert client.stats.as_dict() == {
        "calls": 2,
        "requests": 2,
        "retries": 0,
        "failures": 0,
        "prompt_tokens": 2 * first.prompt_tokens,
        "completion_tokens": 8,
    }
    await client.aclose()


@pytest.mark.parametrize("status", [500, 503, 429])
async def test_transient_failures_are_retried_with_backoff(fake, status, make_client):
    fake.fail_first, fake.status = 2, status
    client = make_client(fake.url, backoff=0.1, max_retries=3)
    start = time.perf_counter()
    reply = await client.chat(HELLO, 8)
    assert time.perf_counter() - start >= 0.1 + 0.2  # backoff * 2**attempt for attempts 0 and 1
    assert reply.text == "fake reply" and (reply.prompt_tokens, reply.completion_tokens) == (5, 2)
    assert len(fake.requests) == 3
    assert (client.stats.calls, client.stats.requests, client.stats.retries, client.stats.failures) == (1, 3, 2, 0)


async def test_retry_after_header_is_honoured(fake, make_client):
    fake.fail_first, fake.status, fake.retry_after = 1, 429, "0.3"
    client = make_client(fake.url, backoff=0.01)
    start = time.perf_counter()
    await client.chat(HELLO, 8)
    assert time.perf_counter() - start >= 0.3


async def test_exhausted_retries_raise_with_cause_and_no_secret(fake, caplog, make_client):
    caplog.set_level(logging.DEBUG)  # every logger, the openai and HTTP libraries' included
    fake.fail_first, fake.status = 100, 500
    client = make_client(fake.url, max_retries=2)
    with pytest.raises(ChatRequestError) as info:
        await client.chat(HELLO, 8)
    err = info.value
    assert (err.attempts, err.status_code, err.transient) == (3, 500, True)
    assert isinstance(err.__cause__, openai.InternalServerError)
    assert "500" in str(err) and "after 3 attempts" in str(err)
    assert len(fake.requests) == 3
    assert (client.stats.requests, client.stats.retries, client.stats.failures) == (3, 2, 1)
    assert fake.requests[0]["headers"]["Authorization"] == f"Bearer {SECRET}"  # the key was really sent
    assert "retry 1/2" in caplog.text  # retries are logged ...
    printed = "".join(traceback.format_exception(err))  # what a crash would print, the chained cause included
    assert_no_secret(str(err), repr(err), printed, repr(client), caplog.text)  # ... without the key
    assert "injected failure for key ***" in str(err)


async def test_client_error_is_not_retried(fake, caplog, make_client):
    caplog.set_level(logging.DEBUG)
    fake.fail_first, fake.status = 100, 400
    client = make_client(fake.url, max_retries=3)
    with pytest.raises(ChatRequestError) as info:
        await client.chat(HELLO, 8)
    assert (info.value.attempts, info.value.status_code, info.value.transient) == (1, 400, False)
    assert isinstance(info.value.__cause__, openai.BadRequestError)
    assert len(fake.requests) == 1 and client.stats.retries == 0 and client.stats.failures == 1
    assert_no_secret("".join(traceback.format_exception(info.value)), caplog.text)


async def test_server_that_never_answers_times_out(fake, caplog, make_client):
    caplog.set_level(logging.DEBUG)
    fake.hang = True
    client = make_client(fake.url, timeout=0.3, max_retries=1)
    start = time.perf_counter()
    with pytest.raises(ChatRequestError) as info:
        await client.chat(HELLO, 8)
    elapsed = time.perf_counter() - start
    assert 0.6 <= elapsed < 5
    assert (info.value.attempts, info.value.status_code, info.value.transient) == (2, None, True)
    assert isinstance(info.value.__cause__, (asyncio.TimeoutError, openai.APITimeoutError))
    assert len(fake.requests) == 2
    assert_no_secret(str(info.value), caplog.text)


async def test_refused_connection_is_retried_then_raised(make_client):
    client = make_client(f"http://127.0.0.1:{free_port()}/v1", max_retries=2)  # nothing listens there
    with pytest.raises(ChatRequestError) as info:
        await client.chat(HELLO, 8)
    assert info.value.attempts == 3 and isinstance(info.value.__cause__, openai.APIConnectionError)


async def test_concurrency_limit_bounds_requests_in_flight(fake, make_client):
    fake.delay = 0.15
    client = make_client(fake.url, max_concurrency=3)
    replies = await asyncio.gather(*(client.chat(HELLO, 8) for _ in range(10)))
    assert len(replies) == 10
    assert fake.max_in_flight == 3  # reached, never exceeded


async def test_azure_url_headers_and_sampling_pass_through(fake, make_client):
    base = fake.url.removesuffix("/v1") + "/openai/deployments/my-gpt?api-version=2024-10-21"
    client = make_client(base, extra_headers={"x-tenant": "t1"}, default_sampling={"temperature": 0.7})
    await client.chat(HELLO, 17, top_p=0.95, seed=3, stop=["</x>"], top_k=20)
    request = fake.requests[0]
    assert request["path"] == "/openai/deployments/my-gpt/chat/completions"
    assert request["query"] == {"api-version": "2024-10-21"}
    assert request["headers"]["Authorization"] == f"Bearer {SECRET}"
    assert request["headers"]["api-key"] == SECRET
    assert request["headers"]["x-tenant"] == "t1"
    body = request["body"]
    assert body["messages"] == HELLO and body["model"] == "fake-model" and body["max_tokens"] == 17
    sent = {key: body[key] for key in ("temperature", "top_p", "seed", "stop", "top_k")}
    assert sent == {"temperature": 0.7, "top_p": 0.95, "seed": 3, "stop": ["</x>"], "top_k": 20}  # top_k: extra_body


async def test_url_and_api_key_from_environment(fake, monkeypatch):
    monkeypatch.setenv("URL", fake.url)
    monkeypatch.setenv("API_KEY", SECRET)
    client = OpenAIChatClient(None, "fake-model")
    assert client.base_url == fake.url
    await client.chat(HELLO, 8)
    assert fake.requests[0]["headers"]["api-key"] == SECRET
    assert_no_secret(repr(client))
    await client.aclose()


@pytest.mark.parametrize(
    ("content", "extra", "text"),
    [
        ("<tool_call>x", {"stop_reason": "</tool_call>"}, "<tool_call>x</tool_call>"),  # vLLM: appended
        ("<tool_call>x</tool_call>", {"stop_reason": "</tool_call>"}, "<tool_call>x</tool_call>"),  # not doubled
        ("<tool_call>x", {"stop_reason": 151645}, "<tool_call>x"),  # a stop token id, not a string
        ("<tool_call>x", {}, "<tool_call>x"),  # servers that do not report it
    ],
)
async def test_matched_stop_string_is_appended(fake, content, extra, text, make_client):
    fake.content, fake.choice_extra = content, extra
    reply = await make_client(fake.url).chat(HELLO, 8, stop=["</tool_call>"])
    assert reply.text == text and reply.finish_reason == "stop"


def test_client_survives_successive_event_loops(fake):
    client = OpenAIChatClient(fake.url, "fake-model", max_concurrency=2)

    async def chat_then_close():
        try:
            return await client.chat(HELLO, 8)
        finally:
            await client.aclose()

    with warnings.catch_warnings():  # the first loop's connection is dropped unclosed, as a user's would be
        warnings.simplefilter("ignore", ResourceWarning)
        first = asyncio.run(client.chat(HELLO, 8))  # connections left open in a loop that is then closed ...
        second = asyncio.run(chat_then_close())  # ... a new loop binds fresh connections and semaphore
        gc.collect()
    assert first.text == second.text == "fake reply"
    assert client.stats.requests == 2


async def two_calls(sample, client, config) -> str:
    """A minimal agent: two calls, then the answer flagged final."""
    for step in range(3):
        reply = await client.chat([{"role": "user", "content": f"turn {step}"}], 4, final=step == 2)
    return reply.text


async def test_a_stop_that_arrives_with_the_reply_is_not_swallowed(fake, make_client):
    # The reply is read, then the caller is cancelled before control returns to it. asyncio.wait_for on
    # Python 3.11 returned the reply and dropped the cancellation; the session must stop instead of reading on.
    client = make_client(fake.url)
    http, _ = client._bind()
    real_post = http.post

    async def post_then_stop(*args, **kwargs):
        response = await real_post(*args, **kwargs)
        caller.cancel()
        return response

    http.post = post_then_stop
    session = FunctionEpisode(two_calls, {}, WorkflowConfig(), "two_calls")
    caller = asyncio.create_task(run_session(session, client))
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert len(fake.requests) == 1 and session.history == []


@pytest.mark.parametrize(
    "body, shown",
    [
        ({"detail": "Server is pinned to '/m'; requested 'tiny'."}, "Server is pinned to '/m'; requested 'tiny'."),
        ({"error": "model not found"}, "model not found"),
        ({"code": 7}, '{"code": 7}'),
        ("plain text from a proxy", "plain text from a proxy"),
    ],
)
async def test_what_the_server_said_is_in_the_error(fake, make_client, body, shown):
    fake.fail_first, fake.status, fake.error_body = 1, 400, body
    with pytest.raises(ChatRequestError) as info:
        await make_client(fake.url).chat(HELLO, 8)
    assert f"BadRequestError (HTTP 400): Error code: 400 - {shown}" in str(info.value)


async def test_a_pinned_transformers_server_says_why_it_refused(tiny_server):
    client = OpenAIChatClient(tiny_server.base_url, "tiny")  # the server is pinned to its model folder
    with pytest.raises(ChatRequestError) as info:
        await client.chat(HELLO, 4)
    await client.aclose()
    assert f"(HTTP 400): Error code: 400 - Server is pinned to '{tiny_server.model}'; requested 'tiny'." in str(
        info.value
    )


async def test_the_server_samples_at_the_temperature_asked(tiny_server):
    # transformers serve decodes greedily unless the model's generation config switches sampling on: the
    # launcher serves a view of the model that does, so the requested temperature is really applied.
    client = OpenAIChatClient(tiny_server.base_url, tiny_server.model)
    one = await client.chat(HELLO, 16, temperature=1.0, seed=1)
    two = await client.chat(HELLO, 16, temperature=1.0, seed=2)
    again = await client.chat(HELLO, 16, temperature=1.0, seed=1)
    greedy = [await client.chat(HELLO, 16, temperature=0, seed=s) for s in (1, 2)]
    await client.aclose()
    assert one.text != two.text  # two samples of one prompt differ
    assert one.text == again.text  # and the seed is applied
    assert greedy[0].text == greedy[1].text  # temperature 0 stays greedy whatever the seed


def test_the_attempt_timeout_scales_with_the_request():
    client = OpenAIChatClient("http://127.0.0.1:9/v1", "m", timeout=30, timeout_per_token=0.5)
    messages = [{"role": "system", "content": "x" * 40}, {"role": "user", "content": "y" * 400}]
    # 440 characters ~ 110 prompt tokens, plus 100 new tokens: 30 + 0.5 * 210
    assert client.attempt_timeout(messages, 100) == 135.0
    assert client.attempt_timeout([{"role": "user", "content": ""}], 0) == 30.0
    assert OpenAIChatClient("http://127.0.0.1:9/v1", "m", timeout=7).attempt_timeout(messages, 1000) == 7.0
