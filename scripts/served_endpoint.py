"""The endpoint a benchmark measures (``scripts/bench_serve.py`` and its soak, ``scripts/serve_soak.py``): an endpoint
started in front of the instant upstream (``scripts/instant_server.py``), and the requests they send it."""

from __future__ import annotations

import contextlib
import http.client
import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from recurrent.local_server import free_port, health_probe, managed_server

QUESTION = "What is the special magic number mentioned in the provided text?"
MODEL = "instant"


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


class Endpoint:
    """HTTP/1.1 to the endpoint, one request at a time, the body bytes ready in advance. The connection is made
    before the clock starts: the server closes an idle keep-alive connection after a few seconds (uvicorn: 5 s),
    shorter than an in-process pass over a long document."""

    def __init__(self, port: int) -> None:
        self.port = port

    def chat(self, body: bytes) -> tuple[float, dict]:
        seconds, status, reply = self.request("POST", "/v1/chat/completions", body)
        if status != 200:
            raise RuntimeError(f"endpoint answered {status}: {reply}")
        return seconds, reply

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[float, int, dict]:
        """(seconds, HTTP status, JSON reply) of one request on a fresh connection."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)
        connection.connect()
        try:
            start = time.perf_counter()
            connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            data = response.read()
            seconds = time.perf_counter() - start
        finally:
            connection.close()
        return seconds, response.status, json.loads(data)


@contextlib.contextmanager
def upstream_and_endpoint(
    logs: Path, tiny: Path, endpoint_flags: list[str], upstream_flags: list[str] = (), open_files: int | None = None
) -> Iterator[tuple[str, int, Any]]:
    """The instant upstream (``upstream_flags`` added) and an endpoint in front of it (the ``tiny`` model's
    tokenizer, ``endpoint_flags`` added; ``open_files``: its limit on open files, soft and hard), each in its own
    process, their logs in ``logs``: (the upstream's root URL, the endpoint's port, the endpoint's process)."""
    upstream_port, port = free_port(), free_port()
    logs.mkdir(parents=True, exist_ok=True)
    upstream_root = f"http://127.0.0.1:{upstream_port}"
    upstream_cmd = [sys.executable, str(Path(__file__).with_name("instant_server.py")), "--port", str(upstream_port),
                    "--served-model-name", MODEL, *upstream_flags]  # fmt: skip
    endpoint_cmd = [sys.executable, "-m", "taskutils.endpoint", "--upstream", f"{upstream_root}/v1", "--model", MODEL,
                    "--tokenizer", str(tiny), "--port", str(port), *endpoint_flags]  # fmt: skip
    if open_files is not None:
        endpoint_cmd = ["bash", "-c", f'ulimit -n {open_files} && exec "$@"', "bash", *endpoint_cmd]
    with (
        managed_server(upstream_cmd, health_probe(f"{upstream_root}/health"), logs / "upstream.log", 60, 0.05),
        managed_server(
            endpoint_cmd, health_probe(f"http://127.0.0.1:{port}/health"), logs / "endpoint.log", 120, 0.1
        ) as process,
    ):
        yield upstream_root, port, process


def body_of(document: str, model: str = MODEL) -> bytes:
    """The request a chat client sends: document and question in one user message, split at the last blank line
    (the endpoint's default question mode)."""
    message = {"role": "user", "content": f"{document.strip()}\n\n{QUESTION}"}
    return json.dumps({"model": model, "messages": [message], "temperature": 0.0}).encode()
