"""The server as a service, against a scripted upstream (real sockets, no model time): a client that goes away
cancels its remaining turns upstream; the limit on documents in flight and its queue; an upstream that is down or
fails, as HTTP statuses quoting it; timeouts; keys never logged; the request's sampling on every turn; pass-through;
malformed requests. Events and counters decide every wait, never a pause."""

from __future__ import annotations

import json
import logging
import math
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from openai import OpenAI
from serve_helpers import (
    DOCUMENT,
    HTTP,
    QUESTION,
    UPSTREAM_COMPLETION_TOKENS,
    UPSTREAM_PROMPT_TOKENS,
    WAIT,
    counters,
    health,
    served,
    sse_events,
    wait_event,
    wait_until,
)

from recurrent.local_server import free_port

UPSTREAM_KEY = "sk-upstream-SECRET-41d7"
SERVER_KEY = "sk-server-SECRET-9c2e"


def turns_for(tokenizer, document: str, chunk_size: int) -> int:
    """Memory turns (one per chunk of the stripped document) plus the answer, counted with the tokenizer itself."""
    return math.ceil(len(tokenizer.encode(document.strip(), add_special_tokens=False)) / chunk_size) + 1


def openai_client(base: str, key: str = "unused") -> OpenAI:
    return OpenAI(base_url=base, api_key=key, max_retries=0, timeout=WAIT)


def field_request(document: str = DOCUMENT, **extra) -> dict:
    return {
        "model": "memagent",
        "messages": [{"role": "user", "content": QUESTION}],
        "memagent": {"document": document},
        **extra,
    }


def post(base: str, body, **kwargs) -> httpx.Response:
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    headers = {"Content-Type": "application/json", **kwargs.pop("headers", {})}
    return HTTP.post(f"{base}/chat/completions", content=content, headers=headers, timeout=WAIT, **kwargs)


# ---- usage, sampling, the upstream's model name ----


def test_usage_sums_every_turn_and_sampling_reaches_every_turn(scripted, tiny_tokenizer):
    scripted.reply = "the memory so farEND"
    with served(scripted.url, scripted.model, tiny_tokenizer, chunk_size=16, max_new=11) as (base, _):
        sampling = {"temperature": 0.3, "top_p": 0.5, "seed": 7, "presence_penalty": 0.25, "frequency_penalty": 0.5}
        reply = openai_client(base).chat.completions.create(
            model="memagent",
            messages=[{"role": "user", "content": QUESTION}],
            stop=["END"],
            max_tokens=9,
            extra_body={"memagent": {"document": DOCUMENT}, "top_k": 5},
            **sampling,
        )
    turns = turns_for(tiny_tokenizer, DOCUMENT, 16)
    assert turns >= 4 and scripted.requests == turns
    assert reply.usage.prompt_tokens == UPSTREAM_PROMPT_TOKENS * turns
    assert reply.usage.completion_tokens == UPSTREAM_COMPLETION_TOKENS * turns
    assert reply.usage.total_tokens == (UPSTREAM_PROMPT_TOKENS + UPSTREAM_COMPLETION_TOKENS) * turns
    assert reply.model_extra["memagent"]["turns"] == turns
    assert reply.choices[0].message.content == "the memory so far"  # the stop string is left out, as OpenAI does
    for body in scripted.bodies:
        assert {k: body[k] for k in sampling} == sampling and body["top_k"] == 5
        assert body["model"] == scripted.model  # the upstream's name, not the one clients use
    *memory_turns, final = scripted.bodies
    assert all(body["max_tokens"] == 11 and "stop" not in body for body in memory_turns)
    assert final["max_tokens"] == 9 and final["stop"] == ["END"]  # the request's answer budget and stop: the answer


def test_a_request_without_sampling_gets_the_servers_defaults(scripted, tiny_tokenizer):
    with served(scripted.url, scripted.model, tiny_tokenizer, chunk_size=64) as (base, _):
        openai_client(base).chat.completions.create(
            model="memagent", messages=[{"role": "user", "content": f"{DOCUMENT}\n\n{QUESTION}"}]
        )
    for body in scripted.bodies:
        assert body["temperature"] == 0.7 and body["top_p"] == 0.95  # the paper's
        assert not {"seed", "top_k", "presence_penalty", "stop"} & set(body)
        assert body["max_tokens"] == 1024  # the paper's memory and answer budgets


def test_a_request_that_sets_temperature_alone_samples_at_top_p_one(scripted, tiny_tokenizer):
    # The one rule of recurrent/sampling.py: top_p 1.0 (as OpenAI's API, as training), not the server's 0.95.
    with served(scripted.url, scripted.model, tiny_tokenizer, chunk_size=64) as (base, _):
        openai_client(base).chat.completions.create(
            model="memagent", messages=[{"role": "user", "content": f"{DOCUMENT}\n\n{QUESTION}"}], temperature=0.3
        )
    assert scripted.bodies and all((b["temperature"], b["top_p"]) == (0.3, 1.0) for b in scripted.bodies)


def test_budgets_and_final_prompt_are_the_servers(scripted, tiny_tokenizer):
    settings = {"chunk_size": 16, "max_context": 40, "final_prompt": "boxed"}
    with served(scripted.url, scripted.model, tiny_tokenizer, **settings) as (base, _):
        reply = post(base, field_request())
    extension = reply.json()["memagent"]
    # 40 tokens keep two whole 16-token chunks: the first and last 16 tokens of the document.
    assert extension["document_tokens"] == len(tiny_tokenizer.encode(DOCUMENT, add_special_tokens=False))
    assert (extension["document_tokens_read"], extension["chunks"], extension["turns"]) == (32, 2, 3)
    assert "put the answer in \\boxed{}." in scripted.bodies[-1]["messages"][0]["content"]
    assert "Therefore, the answer is" not in scripted.bodies[-1]["messages"][0]["content"]


# ---- a client that goes away ----


def test_a_client_that_disconnects_cancels_its_remaining_turns(scripted, tiny_tokenizer):
    scripted.hold = {2}  # the second turn waits upstream until released (never, here)
    with served(scripted.url, scripted.model, tiny_tokenizer, chunk_size=16) as (base, _):
        body = json.dumps(field_request()).encode()
        port = int(base.split(":")[2].split("/")[0])
        client = socket.create_connection(("127.0.0.1", port))
        head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        client.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_event(scripted.arrived[2], "the second turn to reach the upstream")
        client.close()
        wait_event(scripted.aborted[2], "the upstream request of the second turn to be closed")
        wait_until(lambda: counters(base)["cancelled"] == 1, "the document to be cancelled")
        state = health(base)
    assert turns_for(tiny_tokenizer, DOCUMENT, 16) > 3  # turns were left to send
    assert scripted.requests == 2  # none after the disconnect
    assert state["counters"]["turns"] == 1 and state["counters"]["completed"] == 0
    assert state["documents"]["running"] == 0


def test_a_streaming_client_that_disconnects_cancels_its_remaining_turns(scripted, tiny_tokenizer):
    scripted.hold = {3}
    with served(scripted.url, scripted.model, tiny_tokenizer, chunk_size=16) as (base, _):
        request = field_request(stream=True, memagent={"document": DOCUMENT, "return_memories": True})
        with httpx.Client(timeout=WAIT) as http, http.stream("POST", f"{base}/chat/completions", json=request) as r:
            assert r.status_code == 200
            events = sse_events(r.iter_lines())
            assert next(events)["choices"][0]["delta"]["role"] == "assistant"
            chunks = turns_for(tiny_tokenizer, DOCUMENT, 16) - 1
            assert next(events)["memagent"] == {"chunk": 1, "chunks": chunks, "memory": scripted.reply}
            wait_event(scripted.arrived[3], "the third turn to reach the upstream")
        wait_event(scripted.aborted[3], "the upstream request of the third turn to be closed")
        wait_until(lambda: counters(base)["cancelled"] == 1, "the document to be cancelled")
    assert scripted.requests == 3


# ---- documents in flight, the queue ----


def test_documents_in_flight_are_limited_and_the_queue_is_bounded(scripted, tiny_tokenizer):
    scripted.hold = {1}  # the first document's first turn waits until released
    short = f"A short note.\n\n{QUESTION}"
    with served(scripted.url, scripted.model, tiny_tokenizer, max_documents=1, max_queue=1) as (base, _):
        client = openai_client(base)

        def ask():
            return client.chat.completions.create(model="memagent", messages=[{"role": "user", "content": short}])

        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(ask)
            wait_event(scripted.arrived[1], "the first document upstream")
            second = pool.submit(ask)
            wait_until(lambda: health(base)["documents"]["queued"] == 1, "the second document to queue")
            with pytest.raises(openai.APIStatusError) as refused:
                ask()  # a slot in use and the queue full
            scripted.release()
            answers = [first.result(WAIT), second.result(WAIT)]
        state = counters(base)
    assert refused.value.status_code == 503 and "busy" in refused.value.message
    assert refused.value.body["code"] == "queue_full"
    assert all(a.choices[0].message.content == scripted.reply for a in answers)
    assert scripted.max_in_flight == 1  # one document at a time reached the upstream
    assert scripted.requests == 4  # two documents of one chunk and an answer each
    assert (state["documents"], state["completed"], state["rejected"]) == (2, 2, 1)


def test_a_document_that_waits_too_long_for_a_slot_is_refused(scripted, tiny_tokenizer):
    scripted.hold = {1}
    short = f"A short note.\n\n{QUESTION}"
    settings = {"max_documents": 1, "queue_timeout": 0.2}
    with served(scripted.url, scripted.model, tiny_tokenizer, **settings) as (base, _), ThreadPoolExecutor(1) as pool:
        first = pool.submit(post, base, {"messages": [{"role": "user", "content": short}]})
        wait_event(scripted.arrived[1], "the first document upstream")
        late = post(base, {"messages": [{"role": "user", "content": short}]})
        scripted.release()
        assert first.result(WAIT).status_code == 200
    assert late.status_code == 503 and late.json()["error"]["code"] == "queue_timeout"
    assert scripted.requests == 2  # the refused document sent nothing


# ---- upstream failures ----


def test_an_upstream_that_is_down_answers_502_naming_it(tiny_tokenizer):
    port = free_port()  # nothing listens there
    upstream = f"http://127.0.0.1:{port}/v1"
    with served(upstream, "down", tiny_tokenizer) as (base, _):
        client = openai_client(base)
        for stream in (False, True):  # a stream opens only once the first turn is in: a real status either way
            with pytest.raises(openai.APIStatusError) as err:
                client.chat.completions.create(
                    model="memagent", messages=[{"role": "user", "content": f"Doc.\n\n{QUESTION}"}], stream=stream
                )
            assert err.value.status_code == 502
            assert upstream in err.value.message and "Connection" in err.value.message
            assert err.value.body["code"] == "upstream_unreachable"
        state = HTTP.get(base.removesuffix("/v1") + "/health", timeout=WAIT)
    assert state.status_code == 503 and state.json()["upstream"]["reachable"] is False
    assert state.json()["counters"]["failed"] == 2


@pytest.mark.parametrize(
    ("status", "payload", "expected", "said"),
    [
        (500, {"error": {"message": "the engine died"}}, 502, "the engine died"),
        (503, "overloaded, try later", 502, "overloaded, try later"),
        (404, {"error": {"message": "The model `x` does not exist."}}, 502, "does not exist"),
        (400, {"error": {"message": "maximum context length is 8 tokens"}}, 400, "maximum context length is 8"),
        (422, {"detail": "top_k is not supported"}, 422, "top_k is not supported"),
        (429, {"error": {"message": "rate limit reached"}}, 429, "rate limit reached"),
        # the upstream's own timeout: the client's request was fine, the upstream too slow (as when it never answers)
        (408, {"error": {"message": "request timed out"}}, 504, "request timed out"),
    ],
)
def test_upstream_failures_become_http_statuses_with_the_upstreams_message(
    scripted, tiny_tokenizer, status, payload, expected, said
):
    scripted.fail = (status, payload)
    with served(scripted.url, scripted.model, tiny_tokenizer) as (base, _):
        response = post(base, {"messages": [{"role": "user", "content": f"Doc.\n\n{QUESTION}"}]})
    error = response.json()["error"]
    assert response.status_code == expected
    assert said in error["message"] and scripted.url in error["message"]
    named = {429: "upstream_rate_limited", 408: "upstream_timeout"}
    assert error["code"] == named.get(status, f"upstream_{status}")
    assert error["type"] == ("invalid_request_error" if expected in (400, 422) else "upstream_error")


@pytest.mark.parametrize(
    ("setting", "code"), [("timeout", "upstream_timeout"), ("document_timeout", "document_timeout")]
)
def test_an_upstream_that_does_not_answer_in_time_is_a_504(scripted, tiny_tokenizer, setting, code):
    scripted.hold = {1}  # never released while the request runs
    with served(scripted.url, scripted.model, tiny_tokenizer, **{setting: 0.3}) as (base, _):
        response = post(base, {"messages": [{"role": "user", "content": f"Doc.\n\n{QUESTION}"}]})
        wait_event(scripted.aborted[1], "the timed-out upstream request to be closed")
    assert response.status_code == 504 and response.json()["error"]["code"] == code


def test_keys_are_sent_but_never_logged_nor_answered(scripted, tiny_tokenizer, caplog):
    caplog.set_level(logging.DEBUG)
    request = {"messages": [{"role": "user", "content": f"Doc.\n\n{QUESTION}"}]}
    with served(
        scripted.url, scripted.model, tiny_tokenizer, api_key=UPSTREAM_KEY, server_key=SERVER_KEY, log_level="debug"
    ) as (base, _):
        assert post(base, request).status_code == 401  # no key
        assert post(base, request, headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = post(base, request, headers={"Authorization": f"Bearer {SERVER_KEY}"})
        scripted.fail = (401, {"error": {"message": f"invalid key {UPSTREAM_KEY}"}})  # an upstream echoing it
        refused = post(base, request, headers={"Authorization": f"Bearer {SERVER_KEY}"})
    assert ok.status_code == 200
    assert scripted.headers[0]["Authorization"] == f"Bearer {UPSTREAM_KEY}"  # the upstream got its key
    assert refused.status_code == 502 and "invalid key ***" in refused.json()["error"]["message"]
    assert caplog.records  # the server logged (debug level): requests, failures
    for text in (caplog.text, ok.text, refused.text):
        assert UPSTREAM_KEY not in text and SERVER_KEY not in text


# ---- pass-through ----


def test_a_short_request_passes_through_and_a_long_one_is_read_by_the_agent(scripted, tiny_tokenizer):
    short = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    with served(scripted.url, scripted.model, tiny_tokenizer, chunk_size=16, passthrough=True) as (base, _):
        client = openai_client(base)
        passed = client.chat.completions.create(model="memagent", messages=short, max_tokens=5, temperature=0)
        assert scripted.bodies[0]["messages"] == short and scripted.bodies[0]["max_tokens"] == 5
        read = client.chat.completions.create(
            model="memagent", messages=[{"role": "user", "content": f"{DOCUMENT}\n\n{QUESTION}"}]
        )
        refused = post(base, {"messages": short, "memagent": {"passthrough": False}})  # off for this request
    assert passed.model_extra["memagent"] == {"passthrough": True, "turns": 1}
    assert passed.choices[0].message.content == scripted.reply and passed.usage.prompt_tokens == UPSTREAM_PROMPT_TOKENS
    assert read.model_extra["memagent"]["turns"] == turns_for(tiny_tokenizer, DOCUMENT, 16)
    assert read.model_extra["memagent"]["question_mode"] == "split"
    assert refused.status_code == 400 and "found no question" in refused.json()["error"]["message"]
    assert scripted.requests == 1 + turns_for(tiny_tokenizer, DOCUMENT, 16)


# ---- malformed requests ----

ONE = [{"role": "user", "content": f"Doc.\n\n{QUESTION}"}]


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("{not json", "not valid JSON"),
        ([], "must be a JSON object"),
        ({"model": "memagent"}, "messages must be a list"),
        ({"messages": [{"content": "x"}]}, "messages[0] must be an object with a string role"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "only text parts"),
        ({"messages": ONE, "n": 2}, "n must be 1"),
        ({"messages": ONE, "tools": [{"type": "function"}]}, "tools"),
        ({"messages": ONE, "logprobs": True}, "logprobs"),
        ({"messages": ONE, "max_tokens": 0}, "max_tokens must be an integer >= 1, got 0"),
        ({"messages": ONE, "temperature": "hot"}, "temperature must be a finite number >= 0, got 'hot'"),
        ({"messages": ONE, "stop": 5}, "stop must be"),
        ({"messages": ONE, "stream": "yes"}, "stream must be"),
        ({"messages": ONE, "memagent": {"question_mod": "split"}}, "unknown field(s) ['question_mod']"),
        ({"messages": ONE, "memagent": {"question_mode": "telepathy"}}, "question_mode must be one of"),
        ({"messages": ONE, "memagent": {"question_mode": "field"}}, "memagent.document, which is missing"),
        ({"messages": ONE, "memagent": {"question_mode": "messages"}}, "found no document"),
        ({"messages": [{"role": "user", "content": "no blank line"}]}, "found no question"),
        ({"messages": ONE, "memagent": {"split_marker": "Q:"}}, "'Q:' (the split marker)"),
        ({"messages": [{"role": "system", "content": "Doc.\n\nQ?"}]}, "found no question"),
        (
            {"messages": [{"role": "user", "content": "Doc."}, {"role": "user", "content": " "}]},
            "last user message is empty",
        ),
        ({"messages": ONE, "stream": True, "memagent": {"question_mode": "field"}}, "memagent.document"),
    ],
)
def test_malformed_requests_are_400_and_send_nothing_upstream(scripted, tiny_tokenizer, body, said):
    with served(scripted.url, scripted.model, tiny_tokenizer) as (base, _):
        response = post(base, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert said in error["message"] and error["type"] == "invalid_request_error"
    assert scripted.requests == 0


# Each out of its range by the rule of recurrent/sampling.py (the ranges vLLM accepts), or NaN / an infinity.
BAD_SAMPLING = [
    ('"temperature": -1', "temperature", "must be a finite number >= 0, got -1"),
    ('"temperature": NaN', "temperature", "must be a finite number >= 0, got nan"),
    ('"temperature": Infinity', "temperature", "got inf"),
    ('"top_p": 0', "top_p", "must be a finite number in (0, 1], got 0"),
    ('"top_p": 1.5', "top_p", "got 1.5"),
    ('"top_p": -Infinity', "top_p", "got -inf"),
    ('"top_k": -2', "top_k", "must be an integer >= -1, got -2"),
    ('"top_k": 2.5', "top_k", "got 2.5"),
    ('"min_p": 1.5', "min_p", "must be a finite number in [0, 1], got 1.5"),
    ('"presence_penalty": 2.5', "presence_penalty", "in [-2, 2], got 2.5"),
    ('"frequency_penalty": NaN', "frequency_penalty", "got nan"),
    ('"repetition_penalty": 0', "repetition_penalty", "must be a finite number > 0, got 0"),
    ('"seed": 18446744073709551616', "seed", "must be an integer in [-9223372036854775808, 9223372036854775807]"),
    ('"seed": true', "seed", "got True"),
    ('"max_tokens": 1.5', "max_tokens", "must be an integer >= 1, got 1.5"),
    ('"max_completion_tokens": -3', "max_completion_tokens", "must be an integer >= 1, got -3"),
    ('"n": 0', "n", "must be an integer >= 1, got 0"),
    ('"n": true', "n", "got True"),
    ('"stop": ["END", 3]', "stop", "must be a string or a list of strings, got ['END', 3]"),
]


@pytest.mark.parametrize(("field", "param", "said"), BAD_SAMPLING)
def test_sampling_values_out_of_range_are_400_naming_the_field(scripted, tiny_tokenizer, field, param, said):
    # Raw JSON text: Python's json (and so the server) reads NaN and Infinity, which a JSON encoder may refuse to write.
    body = f'{{"messages": {json.dumps(ONE)}, {field}}}'
    with served(scripted.url, scripted.model, tiny_tokenizer) as (base, _):
        response = post(base, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["message"].startswith(f"{param} ") and said in error["message"], error["message"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert scripted.requests == 0


def test_a_bad_temperature_through_the_official_client_is_its_400(scripted, tiny_tokenizer):
    with (
        served(scripted.url, scripted.model, tiny_tokenizer) as (base, _),
        pytest.raises(openai.BadRequestError) as bad,
    ):
        openai_client(base).chat.completions.create(model="memagent", messages=ONE, temperature=-1)
    assert bad.value.status_code == 400 and bad.value.body["param"] == "temperature"
    assert "temperature must be a finite number >= 0, got -1" in bad.value.message
    assert scripted.requests == 0  # refused here: nothing was sent upstream, no retry


def test_another_model_is_404_and_the_official_client_reads_the_400s(scripted, tiny_tokenizer):
    with served(scripted.url, scripted.model, tiny_tokenizer) as (base, _):
        client = openai_client(base)
        assert [m.id for m in client.models.list()] == ["memagent"]
        assert client.models.retrieve("memagent").id == "memagent"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("gpt-4o")
        with pytest.raises(openai.NotFoundError) as unknown:
            client.chat.completions.create(model="gpt-4o", messages=ONE)
        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(model="memagent", messages=[{"role": "user", "content": "one line"}])
    assert "'gpt-4o' is not served here" in unknown.value.message and unknown.value.body["code"] == "model_not_found"
    assert "found no question" in bad.value.message
    assert scripted.requests == 0


# ---- what a hostile client may send: a client error (4xx in OpenAI's shape), never a 500 ----

LONE = "Doc \\ud800 end."  # a lone surrogate as a JSON escape: a str Python holds, but no Unicode text


def _field_body(document: str, question: str | None = None, **ext) -> str:
    """Raw JSON text (an encoder would escape the backslash of LONE)."""
    fields = [f'"document": "{document}"']
    if question is not None:
        fields.append(f'"question": "{question}"')
    fields += [f'"{name}": {json.dumps(value)}' for name, value in ext.items()]
    return f'{{"messages": [{{"role": "user", "content": "{QUESTION}"}}], "memagent": {{{", ".join(fields)}}}}}'


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (_field_body(LONE), "memagent.document"),
        (_field_body("Doc.", "Why \\udfff?"), "memagent.question"),
        (f'{{"messages": [{{"role": "user", "content": "{LONE}\\n\\nWhy?"}}]}}', "messages[0].content"),
        (
            f'{{"messages": [{{"role": "user", "content": [{{"type": "text", "text": "{LONE}\\n\\nWhy?"}}]}}]}}',
            "messages[0].content",
        ),
    ],
    ids=["document", "question", "message", "text-part"],
)
@pytest.mark.parametrize("spool_bytes", [1 << 20, 0])  # the body in memory, and on disk with its strings there
def test_a_lone_surrogate_in_a_text_is_400_naming_the_field(scripted, tiny_tokenizer, body, param, spool_bytes):
    with served(scripted.url, scripted.model, tiny_tokenizer, spool_bytes=spool_bytes, spool_string_chars=4) as (
        base,
        _,
    ):
        response = post(base, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert error["message"].startswith(f"{param} holds a lone surrogate"), error["message"]
    assert scripted.requests == 0


@pytest.mark.parametrize("spool_bytes", [1 << 20, 0])
def test_json_nested_too_deep_is_400(scripted, tiny_tokenizer, spool_bytes):
    deep = '{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with served(scripted.url, scripted.model, tiny_tokenizer, spool_bytes=spool_bytes) as (base, _):
        response = post(base, deep)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "not valid JSON" in error["message"] and "nest" in error["message"], error["message"]
    assert error["type"] == "invalid_request_error"


def test_unknown_routes_and_wrong_methods_answer_in_openais_shape(scripted, tiny_tokenizer):
    with served(scripted.url, scripted.model, tiny_tokenizer) as (base, _):
        missing = HTTP.get(f"{base}/completions", timeout=WAIT)
        wrong = HTTP.get(f"{base}/chat/completions", timeout=WAIT)
        wrong_models = HTTP.post(f"{base}/models", timeout=WAIT)
    for response, status in ((missing, 404), (wrong, 405), (wrong_models, 405)):
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
        assert response.request.url.path in error["message"], error["message"]
    assert wrong.headers["allow"] == "POST"


def test_an_empty_field_question_blames_the_field(scripted, tiny_tokenizer):
    with served(scripted.url, scripted.model, tiny_tokenizer) as (base, _):
        response = post(base, _field_body("Doc.", " "))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "memagent.question" and "the question is empty" in error["message"], error
