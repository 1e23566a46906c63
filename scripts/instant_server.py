"""A real OpenAI-compatible HTTP server whose "model" answers instantly: server time ~0, so whatever a client
measures beyond the server's own handling time is client and harness overhead.

Used by ``scripts/bench_eval_harness.py`` (requests per second, added latency, in-flight requests vs the
limit) and by the serving tests as a stand-in for ``vllm serve`` (it accepts vLLM's command line and ignores
the options it does not need). Standard library only (asyncio streams, HTTP/1.1 keep-alive).

    python scripts/instant_server.py [serve] [MODEL] --port 8000 [--served-model-name NAME]
        [--reply TEXT] [--reply-repeat N] [--delay SECONDS]

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions``, ``GET /health``, ``GET /stats`` (requests
served, peak in-flight requests, total server-side seconds), ``POST /stats/reset``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass


@dataclass
class Stats:
    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    server_seconds: float = 0.0  # request line received -> response written, summed over chat requests


class InstantServer:
    def __init__(self, model: str = "instant", reply: str = "Therefore, the answer is 42.", delay: float = 0.0):
        self.model = model
        self.reply = reply
        self.delay = delay
        self.stats = Stats()
        # A huge reply (--reply-repeat) is encoded once: serializing 100 MiB per request would hold this server's
        # loop for seconds, and its /v1/models with it.
        self.encoded = json.dumps(self._completion({})).encode() if len(reply) > 1 << 20 else None

    def _completion(self, body: dict) -> dict:
        prompt_chars = sum(len(str(m.get("content", ""))) for m in body.get("messages", []))
        return {
            "id": "chatcmpl-instant",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": self.reply}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": prompt_chars // 4,
                "completion_tokens": max(1, len(self.reply) // 4),
                "total_tokens": prompt_chars // 4 + max(1, len(self.reply) // 4),
            },
        }

    async def _respond(self, path: str, method: str, body: bytes) -> tuple[int, dict | bytes]:
        if method == "GET" and path.rstrip("/") in ("/v1/models", "/models"):
            return 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        if method == "GET" and path == "/health":
            return 200, {"status": "ok"}
        if method == "GET" and path == "/stats":
            s = self.stats
            return 200, {"requests": s.requests, "max_in_flight": s.max_in_flight, "server_seconds": s.server_seconds}
        if method == "POST" and path == "/stats/reset":
            self.stats = Stats()
            return 200, {"status": "reset"}
        if method == "POST" and path.endswith("/chat/completions"):
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.encoded is not None:
                return 200, self.encoded
            return 200, self._completion(json.loads(body or b"{}"))
        return 404, {"error": {"message": f"no route {method} {path}"}}

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                start = time.perf_counter()
                method, target, _ = line.decode("latin-1").split(" ", 2)
                headers = {}
                while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = header.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", 0) or 0))
                chat = target.split("?")[0].endswith("/chat/completions")
                if chat:
                    self.stats.requests += 1
                    self.stats.in_flight += 1
                    self.stats.max_in_flight = max(self.stats.max_in_flight, self.stats.in_flight)
                try:
                    status, payload = await self._respond(target.split("?")[0], method, body)
                    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                    reason = "OK" if status == 200 else "Not Found"
                    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                    writer.write(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
                    await writer.drain()
                finally:
                    if chat:
                        self.stats.in_flight -= 1
                        self.stats.server_seconds += time.perf_counter() - start
                if headers.get("connection", "").lower() == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    async def serve(self, host: str, port: int, ready: asyncio.Event | None = None) -> None:
        server = await asyncio.start_server(self.handle, host, port, backlog=4096)
        if ready is not None:
            ready.set()
        async with server:
            await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("positional", nargs="*", help="optional 'serve' and MODEL, as in `vllm serve MODEL`")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None, help="the id /v1/models lists (default: MODEL)")
    parser.add_argument("--reply", default="Therefore, the answer is 42.", help="the content of every answer")
    parser.add_argument("--reply-repeat", type=int, default=1, help="the reply is TEXT this many times (a huge one)")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds of simulated model time per request")
    args, _unknown = parser.parse_known_args(argv)  # vLLM options (tp, max-model-len, ...) are accepted, unused
    words = [w for w in args.positional if w != "serve"]
    model = args.served_model_name or (words[0] if words else "instant")
    print(f"instant server for {model!r} on http://{args.host}:{args.port}/v1", flush=True)
    asyncio.run(InstantServer(model, args.reply * args.reply_repeat, args.delay).serve(args.host, args.port))


if __name__ == "__main__":
    main()
