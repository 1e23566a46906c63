"""Hostile clients and a faulty upstream against the endpoint, round 3 (issue 47): a request's head bounded in bytes
and count, its head and body in seconds, the connections below a bound that keeps room for /health; /health on a
connection of its own, busy apart from unreachable; an upstream reply bounded in size and checked in shape (502);
the client's faults 400; a stream that always ends; the calculator's expressions answered, never a hang. Events,
counters and closed sockets decide every wait, never a pause."""

from __future__ import annotations

import json
import logging
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from aiohttp import web
from serve_helpers import (
    DOCUMENT,
    HTTP,
    QUESTION,
    WAIT,
    health,
    served,
    sse_events,
    stream_lines,
    wait_event,
    wait_until,
)
from threaded_http import serve_in_a_thread

from experiments.calculator.agent import CalculatorConfig
from experiments.calculator.tool import MAX_DIGITS
from taskutils.endpoint import service as service_module
from taskutils.endpoint.connections import ConnectionLimits

MESSAGES = [{"role": "user", "content": f"{DOCUMENT}\n\n{QUESTION}"}]


def connect(base: str, data: bytes = b"") -> socket.socket:
    port = int(base.split(":")[2].split("/")[0])
    client = socket.create_connection(("127.0.0.1", port))
    client.settimeout(WAIT)
    client.sendall(data)
    return client


def read_to_close(client: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a bound of WAIT seconds, never a pause)."""
    received = b""
    try:
        while part := client.recv(65536):
            received += part
    except ConnectionResetError:
        pass
    return received


def post(base: str, body, **kwargs) -> httpx.Response:
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    headers = {"Content-Type": "application/json", **kwargs.pop("headers", {})}
    return HTTP.post(f"{base}/chat/completions", content=content, headers=headers, timeout=WAIT, **kwargs)


# ---- /health ----


def test_health_is_busy_not_unreachable_while_every_slot_waits_on_a_slow_upstream(scripted, tiny_tokenizer):
    # Its check shared the documents' connection pool: with the one slot's call held, it waited 5 s and said 503.
    scripted.hold = {1}
    with (
        served(scripted.url, scripted.model, tiny_tokenizer, chunk_size=4096, max_documents=1) as (base, _),
        ThreadPoolExecutor(1) as pool,
    ):
        answer = pool.submit(post, base, {"messages": MESSAGES})
        wait_event(scripted.arrived[1], "the document's call upstream")
        state = HTTP.get(base.removesuffix("/v1") + "/health", timeout=WAIT)
        scripted.release()
        assert answer.result(WAIT).status_code == 200
    body = state.json()
    assert state.status_code == 200 and body["status"] == "busy"
    assert body["upstream"]["reachable"] is True and body["upstream"]["busy"] is False
    assert body["documents"]["running"] == 1 == body["documents"]["max_documents"]


def test_health_says_busy_when_the_upstream_takes_the_connection_but_does_not_answer(
    scripted, tiny_tokenizer, monkeypatch
):
    monkeypatch.setattr(service_module, "HEALTH_TIMEOUT", 0.2)
    scripted.hold_models = True
    with served(scripted.url, scripted.model, tiny_tokenizer) as (base, _):
        state = HTTP.get(base.removesuffix("/v1") + "/health", timeout=WAIT)
        scripted.release()
    body = state.json()
    assert state.status_code == 200 and body["status"] == "busy"
    assert body["upstream"]["reachable"] is True and body["upstream"]["busy"] is True


# ---- the request's head ----


def test_a_head_over_the_limit_is_431_naming_the_limit(scripted, tiny_tokenizer):
    limits = ConnectionLimits(max_header_bytes=4096)
    with served(scripted.url, scripted.model, tiny_tokenizer, limits=limits) as (base, _):
        small = HTTP.get(base.removesuffix("/v1") + "/health", headers={"X-Note": "a" * 2000}, timeout=WAIT)
        client = connect(base, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 300_000 + b"\r\n\r\n")
        answer = read_to_close(client)
    assert small.status_code == 200
    assert answer.startswith(b"HTTP/1.1 431 ") and b"over 4,096 bytes (--max-header-bytes)" in answer


def test_more_headers_than_the_limit_is_431(scripted, tiny_tokenizer):
    limits = ConnectionLimits(max_headers=20)
    with served(scripted.url, scripted.model, tiny_tokenizer, limits=limits) as (base, _):
        many = {f"X-H{i}": "v" for i in range(30)}
        refused = HTTP.get(base.removesuffix("/v1") + "/health", headers=many, timeout=WAIT)
    assert refused.status_code == 431 and refused.json()["error"]["code"] == "too_many_headers"
    assert "over 20 (--max-headers)" in refused.json()["error"]["message"]


# ---- every second a connection holds ----


def test_an_idle_connection_and_a_half_sent_head_are_closed_at_the_head_deadline(scripted, tiny_tokenizer):
    limits = ConnectionLimits(header_timeout=0.2)
    with served(scripted.url, scripted.model, tiny_tokenizer, limits=limits) as (base, service):
        idle = connect(base)
        half = connect(base, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-")
        assert read_to_close(idle) == b"" and read_to_close(half) == b""
        wait_until(lambda: service.connections.counters.closed_slow_head >= 2, "both counted")
        after = health(base)
    assert after["connections"]["closed_slow_head"] == 2 and after["connections"]["closed_slow_body"] == 0


def test_a_half_sent_body_is_closed_at_the_body_deadline_in_one_log_line(scripted, tiny_tokenizer, caplog):
    limits = ConnectionLimits(body_timeout=0.2)
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n"
    )
    with (
        caplog.at_level(logging.INFO, logger="taskutils.endpoint"),
        served(scripted.url, scripted.model, tiny_tokenizer, limits=limits) as (base, service),
    ):
        client = connect(base, head + b"\r\n" + b'{"messages": [')
        assert read_to_close(client) == b""
        wait_until(lambda: service.connections.counters.closed_slow_body == 1, "the body's deadline counted")
        wait_until(lambda: "--body-timeout" in caplog.text, "its log line")
    lines = [r for r in caplog.records if "--body-timeout" in r.getMessage()]
    assert len(lines) == 1 and "its body did not arrive within 0.2 s (--body-timeout), after 14 of 1,000" in (
        lines[0].getMessage()
    )
    assert not [r for r in caplog.records if r.exc_info]


def test_past_the_connection_bound_the_oldest_idle_connection_makes_room_and_health_answers(scripted, tiny_tokenizer):
    limits = ConnectionLimits(max_connections=3)
    with served(scripted.url, scripted.model, tiny_tokenizer, limits=limits) as (base, service):
        counters = service.connections.counters
        idle = []
        for k in range(5):  # more idle connections than the bound
            idle.append(connect(base))
            wait_until(lambda k=k: len(service.connections.open) == min(k + 1, 3), "the connection taken")
            wait_until(lambda k=k: counters.closed_for_room == max(k - 2, 0), "the oldest closed for it")
        state = HTTP.get(base.removesuffix("/v1") + "/health", timeout=WAIT)
        closed = [read_to_close(c) for c in idle[:3]]
        idle[3].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        still_served = read_to_close(idle[3])
    assert state.status_code == 200 and state.json()["connections"]["closed_for_room"] == 3
    assert closed == [b"", b"", b""] and still_served.startswith(b"HTTP/1.1 200 ")


# ---- the upstream's replies ----


def test_an_upstream_reply_over_its_calls_bound_is_502_upstream_bad_response(scripted, tiny_tokenizer):
    huge = {"choices": [{"message": {"role": "assistant", "content": "x" * (8 << 20)}, "finish_reason": "stop"}]}
    scripted.raw = {1: ("application/json", json.dumps(huge).encode())}
    with served(scripted.url, scripted.model, tiny_tokenizer, chunk_size=4096, max_new=16) as (base, _):
        response = post(base, {"messages": MESSAGES})
    error = response.json()["error"]
    assert response.status_code == 502 and error["code"] == "upstream_bad_response"
    assert "bytes, over the 71,680 its call allows" in error["message"]  # 64 KiB + 16 tokens x 64 chars x 6 bytes


def completion(**fields) -> bytes:
    choice = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    body = {"id": "x", "object": "chat.completion", "choices": [choice], "usage": {"prompt_tokens": 1}}
    for key, value in fields.items():
        if key == "content":
            choice["message"]["content"] = value
        else:
            body[key] = value
    return json.dumps(body).encode()


MALFORMED = {
    "an HTML page": ("text/html", b"<html><body>502 Bad Gateway</body></html>"),
    "an HTML page said to be JSON": ("application/json", b"<html><body>502 Bad Gateway</body></html>"),
    "choices a string": ("application/json", completion(choices="none")),
    "choices a dict": ("application/json", completion(choices={"0": {"message": {}}})),
    "choices [1]": ("application/json", completion(choices=[1])),
    "content an int": ("application/json", completion(content=5)),
    "content a list": ("application/json", completion(content=[{"type": "text", "text": "ok"}])),
    "usage of strings": ("application/json", completion(usage={"prompt_tokens": "12", "completion_tokens": "3"})),
    "usage a list": ("application/json", completion(usage=[12, 3])),
    "a lone surrogate": ("application/json", completion(content="ok").replace(b'"ok"', b'"\\ud800ok"')),
}


def test_every_malformed_upstream_reply_is_502_upstream_bad_response(scripted, tiny_tokenizer, caplog):
    # Eight of these shapes were a 500 with a traceback ("internal error"), which an OpenAI client retries.
    shapes = list(MALFORMED)
    scripted.raw = {k + 1: MALFORMED[shape] for k, shape in enumerate(shapes)}  # the k-th request's one call
    with served(scripted.url, scripted.model, tiny_tokenizer, chunk_size=4096) as (base, service):
        errors = {shape: post(base, {"messages": MESSAGES}) for shape in shapes}
    for shape, response in errors.items():
        error = response.json()["error"]
        assert response.status_code == 502 and error["code"] == "upstream_bad_response", (shape, error)
        assert "returned a malformed reply" in error["message"], (shape, error)
    assert scripted.requests == len(shapes) == service.client.stats.requests  # one each: never retried
    assert not [r for r in caplog.records if r.exc_info]  # no traceback


def test_a_malformed_reply_mid_stream_ends_it_with_an_error_event_and_done(scripted, tiny_tokenizer):
    # A memory that is no Unicode text cut the stream with neither an error event nor [DONE].
    scripted.raw = {2: MALFORMED["a lone surrogate"]}
    request = {"messages": MESSAGES, "stream": True, "memagent": {"return_memories": True}}
    with served(scripted.url, scripted.model, tiny_tokenizer, chunk_size=16, max_new=8) as (base, _):
        events = list(sse_events(iter(stream_lines(base, request))))
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "upstream_bad_response"
    assert [e["memagent"]["chunk"] for e in events[1:-2]] == [1]  # the first memory, then the error


# ---- the client's faults: 400, never a 500 ----

SURROGATE_ROLE = '{"messages": [{"role": "\\ud800", "content": "hi"}], "memagent": {"passthrough": true}}'
SURROGATE_STOP = json.dumps({"messages": MESSAGES}).replace("}]", '}], "stop": "\\udc00"', 1)


@pytest.mark.parametrize(
    ("body", "param", "said"),
    [
        ({"messages": []}, "messages", "found no question"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role", "got 'wizard'"),
        (SURROGATE_ROLE, "messages[0].role", "got '\\ud800'"),
        (SURROGATE_STOP, "stop[0]", "lone surrogate"),
        ({"messages": MESSAGES, "metadata": json.loads("[" * 250 + "]" * 250)}, None, "nests too deep"),
    ],
)
def test_the_clients_fault_is_400(scripted, tiny_tokenizer, body, param, said):
    with served(scripted.url, scripted.model, tiny_tokenizer) as (base, _):
        response = post(base, body)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param and said in error["message"], error
    assert scripted.requests == 0


def test_one_nesting_rule_whatever_the_bodys_size(scripted, tiny_tokenizer):
    deep = {"messages": MESSAGES, "metadata": json.loads("[" * 250 + "]" * 250)}
    shallow = {"messages": MESSAGES, "metadata": json.loads("[" * 150 + "]" * 150)}
    with served(scripted.url, scripted.model, tiny_tokenizer, chunk_size=4096, spool_bytes=0) as (base, _):
        on_disk = [post(base, deep), post(base, shallow)]
    with served(scripted.url, scripted.model, tiny_tokenizer, chunk_size=4096) as (base, _):
        in_memory = [post(base, deep), post(base, shallow)]
    assert [r.status_code for r in on_disk] == [400, 200] == [r.status_code for r in in_memory]
    said = in_memory[0].json()["error"]["message"]
    assert said.endswith("nests too deep (over 200 levels)") and on_disk[0].json()["error"]["message"].startswith(said)


@pytest.mark.parametrize(
    "messages", [[], [{"role": "system", "content": "Be brief."}], [{"role": "bot", "content": "What is 2+2?"}]]
)
def test_the_openai_calculator_gets_no_request_without_a_user_message(scripted, messages):
    with served(scripted.url, scripted.model, None, agent="calculator_openai") as (base, _):
        response = post(base, {"messages": messages})
    assert response.status_code == 400 and scripted.requests == 0, response.json()


# ---- the calculator: a model's expression never holds the server ----


def calculator_app(expression: str, seen: list[dict]) -> web.Application:
    """The model: a question gets a calculator call of ``expression``, a tool response gets boxed."""

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        last = body["messages"][-1]["content"]
        call = json.dumps({"name": "calculate", "arguments": {"expression": expression}})
        text = "\\boxed{0}" if "<tool_response>" in last else f"<tool_call>{call}</tool_call>"
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        return web.json_response({"choices": [choice], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", lambda request: web.json_response({"data": []}))
    return app


@pytest.mark.parametrize("expression", ["(((9**64)**64)**64)**64", "((9**64)**64)**2"])
def test_a_calculator_call_of_an_unbounded_expression_is_answered_with_the_tools_error(expression):
    # The first held the event loop for hours, /health included; the second was a 500 (an uncaught ValueError).
    seen: list[dict] = []
    with (
        serve_in_a_thread(calculator_app(expression, seen), wait_s=WAIT) as url,
        served(url, "m", None, agent="calculator") as (base, _),
    ):
        response = post(base, {"messages": [{"role": "user", "content": "What is it?"}]})
        state = HTTP.get(base.removesuffix("/v1") + "/health", timeout=WAIT)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "\\boxed{0}"
    said = f"error: the result would have more than {MAX_DIGITS} digits"[: CalculatorConfig().max_result_chars]
    assert seen[1]["messages"][-1]["content"] == f"<tool_response>{said}</tool_response>"
    assert state.status_code == 200


# ---- usage of any agent, and the model's context ----


def test_usage_of_any_agent_sums_every_call(scripted):
    # Three calls of the calculator, two tool calls and the answer: usage is what the upstream did, the last call's
    # tokens included.
    call = json.dumps({"name": "calculate", "arguments": {"expression": "6*7"}})
    choice = {"index": 0, "message": {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"}}
    reply = {"choices": [{**choice, "finish_reason": "stop"}], "usage": {"prompt_tokens": 10, "completion_tokens": 4}}
    scripted.raw = {k: ("application/json", json.dumps(reply).encode()) for k in (1, 2)}
    with served(scripted.url, scripted.model, None, agent="calculator") as (base, _):
        response = post(base, {"messages": [{"role": "user", "content": "What is 6 * 7?"}]})
    usage = response.json()["usage"]
    assert response.status_code == 200 and scripted.requests == 3
    assert usage == {"prompt_tokens": 10 + 10 + 10, "completion_tokens": 4 + 4 + 3, "total_tokens": 41}


class Tokenizer:
    def __init__(self, model_max_length) -> None:
        self.model_max_length = model_max_length


@pytest.mark.parametrize(
    ("known", "expected"),
    [(4096, 4096), (1 << 24, 1 << 24), ((1 << 24) + 1, 131_072), (int(1e30), 131_072), (0, 131_072), (None, 131_072)],
)
def test_a_tokenizers_model_max_length_is_the_context_only_when_it_is_a_real_one(known, expected):
    from taskutils.endpoint.settings import DEFAULT_MODEL_LEN, ServeSettings, context_length

    assert DEFAULT_MODEL_LEN == 131_072  # 128K tokens (docs/serving.md, "What a request costs")
    assert context_length(ServeSettings(model="m"), Tokenizer(known)) == expected
    assert context_length(ServeSettings(model="m", max_model_len=2048), Tokenizer(known)) == 2048
