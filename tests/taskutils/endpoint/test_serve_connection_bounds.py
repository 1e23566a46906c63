"""What a connection may hold of the endpoint, round 4 (issue 63): a request's head past 65,536 bytes is 431 however
it arrives (docs/serving.md, "What a request costs"); connections waiting on their bodies are bounded, so that
/health keeps answering whatever they send; a stream whose client does not read stops its document's upstream
calls. Scripted raw-socket clients, counters and closed sockets decide every wait, never a pause."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest
from serve_helpers import DOCUMENT, QUESTION, WAIT, health, served, wait_until
from test_serve_limits import connect, read_to_close

from taskutils.endpoint.admission import STREAM_AHEAD
from taskutils.endpoint.connections import ConnectionLimits

HEAD_LIMIT = 65_536  # docs/serving.md: --max-header-bytes, its default


def head_of(size: int) -> bytes:
    """A ``GET /health`` whose head (request line, headers, the blank line) is exactly ``size`` bytes."""
    start, end = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: ", b"\r\n\r\n"
    return start + b"a" * (size - len(start) - len(end)) + end


@pytest.mark.timeout(60)
def test_a_head_past_65536_bytes_is_431_however_it_arrives(scripted, tiny_tokenizer):
    # 65,537 to 100,000 bytes got 200 when the head came whole in one read: h11 bounds only an incomplete one.
    with served(scripted.url, scripted.model, tiny_tokenizer) as (base, _):
        answers = {size: read_to_close(connect(base, head_of(size))) for size in (HEAD_LIMIT, HEAD_LIMIT + 1, 100_000)}
        # the same head sent a byte short, then its last byte: the first part incomplete and within the limit
        split = connect(base, head_of(HEAD_LIMIT + 1)[:-1])
        split.sendall(b"\n")
        answers["split"] = read_to_close(split)
    assert len(head_of(HEAD_LIMIT)) == HEAD_LIMIT
    assert answers[HEAD_LIMIT].startswith(b"HTTP/1.1 200 ")
    for size in (HEAD_LIMIT + 1, 100_000, "split"):
        assert answers[size].startswith(b"HTTP/1.1 431 "), (size, answers[size][:200])
        assert b"over 65,536 bytes (--max-header-bytes)" in answers[size]


UPLOAD_HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
)


@pytest.mark.timeout(60)
def test_bodies_arriving_at_once_are_bounded_and_health_answers_past_the_connection_bound(scripted, tiny_tokenizer):
    # 1,100 connections that each sent a head and one byte of body held every place until --body-timeout: /health
    # failed with connection resets. Here 20 such connections against a bound of 12, 3 of them allowed mid-body:
    # each new one past 3 has the oldest answered 503 and closed.
    limits = ConnectionLimits(max_connections=12, max_uploads=3)
    with served(scripted.url, scripted.model, tiny_tokenizer, limits=limits) as (base, service):
        counters = service.connections.counters
        stalled, closed = [], []
        for k in range(20):
            stalled.append(connect(base, UPLOAD_HEAD + b"{"))
            if k >= 3:
                closed.append(read_to_close(stalled.pop(0)))  # the oldest, its body unread
            wait_until(lambda k=k: counters.uploading == min(k + 1, 3), "its body counted as arriving")
        state = health(base)
        # A request whose body comes in a write of its own, as most clients send one: it takes the oldest's place.
        messages = [{"role": "user", "content": f"{DOCUMENT}\n\n{QUESTION}"}]
        body = json.dumps({"model": "memagent", "messages": messages}).encode()
        head = UPLOAD_HEAD.replace(b"1000", str(len(body)).encode()).replace(
            b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"
        )
        legit = connect(base, head)
        closed.append(read_to_close(stalled.pop(0)))
        legit.sendall(body)
        answered = read_to_close(legit)
        for client in stalled:
            client.close()
        wait_until(lambda: counters.uploading == 0, "the stalled uploads let go")
    assert len(closed) == 18 and all(c.startswith(b"HTTP/1.1 503 ") for c in closed), closed[:1]
    assert (
        b"its body was still arriving when a newer request's needed its place (3 at once: --max-uploads)" in (closed[0])
    )
    connections = state["connections"]
    assert connections["uploading"] == 3 and connections["max_uploading"] == 3
    assert connections["uploads_closed_for_room"] == 17 and connections["refused"] == 0
    assert answered.startswith(b"HTTP/1.1 200 ") and b'"finish_reason"' in answered, answered[:300]


def test_the_upload_bound_defaults_to_the_documents_that_may_run_and_queue():
    from taskutils.endpoint.connections import upload_bound

    assert upload_bound(ConnectionLimits(), max_documents=4, max_queue=64) == 68
    assert upload_bound(ConnectionLimits(max_uploads=5), max_documents=4, max_queue=64) == 5
    with pytest.raises(ValueError, match="max_uploads must be >= 1"):
        ConnectionLimits(max_uploads=0)


def stream_request(base: str, body: bytes) -> socket.socket:
    """A streamed chat request on a connection whose receive buffer is small: a client that reads slowly, or not."""
    port = int(base.split(":")[2].split("/")[0])
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)  # before connect: the window it offers
    client.settimeout(WAIT)
    client.connect(("127.0.0.1", port))
    head = UPLOAD_HEAD.replace(b"1000", str(len(body)).encode()).replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
    client.sendall(head + body)
    return client


@pytest.mark.timeout(60)
def test_a_stream_whose_client_does_not_read_stops_its_documents_upstream_calls(scripted, tiny_tokenizer):
    # A client that read slowly got no backpressure: 461 upstream calls while it read 141 KB, the server growing.
    # Each chunk's event carries a 32 KB memory: the connection's buffers hold a few, then the writer waits on the
    # client, and the document's next upstream call waits on the writer.
    scripted.reply = "remember " * 3_500  # 31,500 characters
    document = " ".join(f"Line {i} tells of the river." for i in range(170))  # some 300 chunks of 8 tokens
    request = {
        "model": "memagent",
        "messages": [{"role": "user", "content": f"{document}\n\n{QUESTION}"}],
        "stream": True,
        "memagent": {"return_memories": True},
    }
    with served(scripted.url, scripted.model, tiny_tokenizer, chunk_size=8, max_new=16384) as (base, service):
        client = stream_request(base, json.dumps(request).encode())
        status = service.admission.status
        wait_until(
            lambda: status()["waiting_for_stream_clients"] == 1 or service.admission.counters.completed,
            "the document waiting for its stream's client (or, without backpressure, done)",
        )
        stopped_at, held = scripted.requests, [len(doc.events._queue) for doc in service.admission.documents]
        state = health(base)
        received = read_to_close(client)  # the client reads at last: the document goes on to its answer
    total = int(re.search(rb'"chunks": (\d+)', received).group(1)) + 1  # every chunk's memory update, the answer
    assert state["counters"]["completed"] == 0 and state["documents"]["waiting_for_stream_clients"] == 1
    assert held == [STREAM_AHEAD]  # what the server itself holds of the stream: its events not yet taken
    # The rest is in the connection's buffers: the kernel's send buffer (at most tcp_wmem's maximum) and the client's
    # receive window, a MiB at most; every event is over 31,500 bytes.
    most_sent = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2]) + (1 << 20)
    assert stopped_at <= most_sent // 31_500 + STREAM_AHEAD + 1 < total, (stopped_at, total)
    assert received.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")  # the stream's end, then the chunked body's
    assert scripted.requests == total > 250
