"""Hostile clients against the endpoint (issue 36): a long request's work is in a slot and stops when its client
leaves; a queued long request is its bytes on disk; many short texts go to disk as one long one does; max_tokens
over the model's context is 400 and no request lifts a turn's timeout; an abandoned upload or deep JSON is one log
line, never a traceback. Events and counters decide every wait, never a pause."""

from __future__ import annotations

import io
import json
import logging
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from serve_helpers import HTTP, QUESTION, WAIT, counters, health, served, wait_event, wait_until

from recurrent.client import OpenAIChatClient
from taskutils.endpoint import app as app_module
from taskutils.endpoint.protocol import LONG_TEXT_FIELDS
from taskutils.endpoint.service import MemAgentService
from taskutils.endpoint.settings import ServeSettings
from taskutils.endpoint.spool import LongText, Stopped, TextSpool
from taskutils.endpoint.spooled_body import parse_spooled

NOTE = "The stone village sits by the river; the mill turns all day."


def many_messages(count: int = 40, **extra) -> dict:
    """A chat of ``count`` short user messages, then the question."""
    chat = [{"role": "user", "content": f"{NOTE} ({k})"} for k in range(count)]
    return {"model": "memagent", "messages": [*chat, {"role": "user", "content": QUESTION}], **extra}


def post(base: str, body, **kwargs) -> httpx.Response:
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    headers = {"Content-Type": "application/json", **kwargs.pop("headers", {})}
    return HTTP.post(f"{base}/chat/completions", content=content, headers=headers, timeout=WAIT, **kwargs)


def send_raw(base: str, body: bytes, length: int | None = None) -> socket.socket:
    """A connection that has sent a chat request's head and ``body`` (part of ``length`` bytes, when given)."""
    port = int(base.split(":")[2].split("/")[0])
    client = socket.create_connection(("127.0.0.1", port))
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    client.sendall(f"{head}Content-Length: {length or len(body)}\r\n\r\n".encode() + body)
    return client


class HeldParse:
    """``parse_spooled`` that waits, once entered, until its stop event is set (its client left), then parses:
    the tests see whether a slot holds the parse and whether leaving stops it."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.stopped = threading.Event()
        self.calls = 0

    def __call__(self, source, spool, string_chars, keys, stop=None):
        self.calls += 1
        self.entered.set()
        if stop is not None and stop.wait(WAIT):
            self.stopped.set()
        return parse_spooled(source, spool, string_chars, keys, stop)


# ---- 1. a client that leaves stops the work of a many-message request ----


def test_a_many_message_request_is_parsed_in_a_slot_and_its_client_leaving_stops_the_parse(
    scripted, tiny_tokenizer, monkeypatch
):
    held = HeldParse()
    monkeypatch.setattr(app_module, "parse_spooled", held)
    with served(scripted.url, scripted.model, tiny_tokenizer, spool_bytes=0, max_documents=1) as (base, _):
        client = send_raw(base, json.dumps(many_messages()).encode())
        wait_event(held.entered, "the parse to start")
        during = health(base)["documents"]
        client.close()
        wait_event(held.stopped, "the parse to be told to stop")
        wait_until(lambda: counters(base)["cancelled"] == 1, "the document to be cancelled")
        after = health(base)["documents"]
    assert during["running"] == 1  # the parse holds the slot: --max-documents sees it
    assert after["running"] == 0 and after["queued"] == 0
    assert scripted.requests == 0


def test_a_parse_told_to_stop_stops_at_its_next_read():
    stop = threading.Event()
    stop.set()
    body = io.BytesIO(json.dumps(many_messages()).encode())
    with pytest.raises(Stopped):
        parse_spooled(body, TextSpool(), 8, LONG_TEXT_FIELDS, stop)


# ---- 2. a queued long request holds its bytes on disk; many short texts go to disk ----


def test_a_queued_long_request_is_not_parsed_until_it_has_a_slot(scripted, tiny_tokenizer, monkeypatch):
    calls = []
    monkeypatch.setattr(app_module, "parse_spooled", lambda *args: calls.append(1) or parse_spooled(*args))
    scripted.hold = {1}  # the first document's first turn waits upstream until released
    settings = {"spool_bytes": 0, "max_documents": 1}
    with served(scripted.url, scripted.model, tiny_tokenizer, **settings) as (base, _), ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, base, many_messages(3))
        wait_event(scripted.arrived[1], "the first document upstream")
        second = pool.submit(post, base, many_messages(3))
        wait_until(lambda: health(base)["documents"]["queued"] == 1, "the second document to queue")
        parsed_while_queued = len(calls)
        scripted.release()
        answers = [first.result(WAIT), second.result(WAIT)]
    assert parsed_while_queued == 1  # the first one only: the queued one is its body file
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    assert len(calls) == 2


def test_many_short_texts_of_a_long_body_go_to_disk_past_the_bound():
    body = json.dumps(many_messages(30)).encode()  # texts of ~64 characters each
    parsed = parse_spooled(io.BytesIO(body), TextSpool(), 200, LONG_TEXT_FIELDS)
    contents = [m["content"] for m in parsed["messages"]]
    in_memory = [c for c in contents if isinstance(c, str)]
    assert [str(c) for c in contents] == [m["content"] for m in json.loads(body)["messages"]]
    assert sum(map(len, in_memory)) < 200 + 70  # up to the bound, and the text that crossed it
    assert len(in_memory) == 4 and all(isinstance(c, LongText) for c in contents[4:])
    assert parsed["model"] == "memagent"  # other keys' strings stay strings


def test_many_short_messages_on_disk_answer_as_in_memory(scripted, tiny_tokenizer):
    request = many_messages(40, temperature=0)
    with served(scripted.url, scripted.model, tiny_tokenizer, chunk_size=64) as (base, _):
        in_memory = post(base, request)
    sent_in_memory = list(scripted.bodies)
    scripted.bodies.clear()
    settings = {"chunk_size": 64, "spool_bytes": 0, "spool_string_chars": 100, "tokenize_window": 200}
    with served(scripted.url, scripted.model, tiny_tokenizer, **settings) as (base, _):
        on_disk = post(base, request)
    assert in_memory.status_code == on_disk.status_code == 200, (in_memory.text, on_disk.text)
    assert on_disk.json()["memagent"] == in_memory.json()["memagent"]
    assert len(sent_in_memory) > 3 and scripted.bodies == sent_in_memory


# ---- 3. max_tokens within the model's context; a turn's timeout has a ceiling ----


@pytest.mark.parametrize("value", [2**70, 1e9, 1.5, "12", 4097], ids=["2**70", "1e9", "1.5", "string", "context+1"])
@pytest.mark.parametrize("name", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("spool_bytes", [1 << 20, 0])
def test_max_tokens_over_the_context_or_not_an_integer_is_400(scripted, tiny_tokenizer, value, name, spool_bytes):
    settings = {"max_model_len": 4096, "spool_bytes": spool_bytes}
    with served(scripted.url, scripted.model, tiny_tokenizer, **settings) as (base, _):
        response = post(base, many_messages(2, **{name: value}))
        within = post(base, many_messages(2, **{name: 4096}))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == name and error["type"] == "invalid_request_error", error
    assert within.status_code == 200, within.text
    assert scripted.requests == 2  # the request within the context only: one chunk and its answer


def test_the_context_is_the_tokenizers_unless_set(scripted, tiny_tokenizer):
    assert tiny_tokenizer.model_max_length == 131_072
    with served(scripted.url, scripted.model, tiny_tokenizer) as (base, service):
        over = post(base, many_messages(2, max_tokens=131_073))
    assert service.max_model_len == 131_072 and over.status_code == 400


def test_a_turns_timeout_has_a_ceiling_no_max_tokens_lifts(tiny_tokenizer):
    messages = [{"role": "user", "content": "x" * 40}]  # 10 tokens as the client estimates them (4 characters each)
    plain = OpenAIChatClient("http://127.0.0.1:9/v1", "m", timeout=5.0, timeout_per_token=0.5)
    capped = OpenAIChatClient("http://127.0.0.1:9/v1", "m", timeout=5.0, timeout_per_token=0.5, max_model_len=100)
    assert plain.attempt_timeout(messages, 2) == capped.attempt_timeout(messages, 2) == 5.0 + 0.5 * 12
    assert capped.attempt_timeout(messages, 10**9) == 5.0 + 0.5 * 100
    MemAgentService(ServeSettings(model="m", max_model_len=100), tiny_tokenizer, plain)
    assert plain.attempt_timeout(messages, 2**70) == 5.0 + 0.5 * 100  # the service set the ceiling


# ---- 4. abandoned uploads and deep JSON: one log line, no traceback ----


@pytest.mark.parametrize("spool_bytes", [1 << 20, 0], ids=["in-memory", "on-disk"])
def test_an_abandoned_upload_is_one_info_line(scripted, tiny_tokenizer, caplog, spool_bytes):
    caplog.set_level(logging.INFO)
    with served(scripted.url, scripted.model, tiny_tokenizer, spool_bytes=spool_bytes) as (base, _):
        client = send_raw(base, b'{"messages": [' + b" " * 100, length=10_000)
        client.close()
        wait_until(lambda: "left during its upload" in caplog.text, "the server to see the client leave")
        post(base, many_messages(2))  # the server goes on serving
    lines = [r for r in caplog.records if "left during its upload" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO, [r.getMessage() for r in caplog.records]
    assert "after 114 of 10,000 bytes" in lines[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16"])
def test_deep_json_on_disk_is_400_without_a_traceback(scripted, tiny_tokenizer, caplog, encoding):
    caplog.set_level(logging.INFO)
    deep = ('{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}").encode(encoding)
    with served(scripted.url, scripted.model, tiny_tokenizer, spool_bytes=0) as (base, _):
        response = post(base, deep)
    assert response.status_code == 400, response.text
    assert "nest" in response.json()["error"]["message"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert len(caplog.text.splitlines()) < 20


# ---- 2. a body's count of JSON values is bounded, whatever their length ----


def test_a_long_body_of_too_many_json_values_is_400_and_sends_nothing(scripted, tiny_tokenizer):
    # 75,001 messages of one character: 3 values each (the object, its role, its content) plus the body object,
    # the list and the model string: 225,006 values, under 300,000; 100,001 messages: 300,006, over it.
    fits = [{"role": "user", "content": "x"}] * 75_001
    over = [{"role": "user", "content": "x"}] * 100_001
    with served(scripted.url, scripted.model, tiny_tokenizer, spool_bytes=0) as (base, _):
        refused = post(base, json.dumps({"model": scripted.model, "messages": over}).encode())
        sent_before = scripted.requests
        answered = post(base, json.dumps({"model": scripted.model, "messages": fits}).encode())
    assert refused.status_code == 400, refused.text
    assert "too many values (over 300,000" in refused.json()["error"]["message"]
    assert sent_before == 0  # the refused body sent nothing upstream
    assert "too many values" not in answered.text  # under the limit: not refused for its count


def test_the_value_count_is_exact_at_the_limit(tmp_path):
    # A list of N zeros is N + 1 values (the list itself): 299,999 zeros fit, 300,000 do not.
    for zeros, fits in ((299_999, True), (300_000, False)):
        body = io.BytesIO(("[" + ",".join(["0"] * zeros) + "]").encode())
        spool = TextSpool(str(tmp_path))
        if fits:
            assert len(parse_spooled(body, spool, 1 << 20, frozenset())) == zeros
        else:
            with pytest.raises(ValueError, match="too many values"):
                parse_spooled(body, spool, 1 << 20, frozenset())
