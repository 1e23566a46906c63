"""Benchmark the evaluation harness's own cost per request, against a server that answers instantly.

The server is ``scripts/instant_server.py`` in its own process (a real HTTP/1.1 server; it reports
how long it spent on each request, ~0.1 ms), so whatever the harness measures beyond that is client and harness
overhead. Printed, side by side in one run:

- bare path (a plain ``httpx`` client, no SDK): the floor any Python HTTP client pays on this machine;
- client path (``recurrent.client.OpenAIChatClient``, what every memory turn goes through): requests/s, mean
  latency per request, mean server time, added latency (latency - server time), harness CPU time per request,
  at concurrency 1 and at ``--concurrency``;
- harness path (``taskutils.memory_eval.runner.run_items``: lazy sessions built in a worker thread, the client,
  scoring, one flushed JSONL line per item), same measures;
- the concurrency limit: with a simulated model time (``--delay``), the peak number of requests the server saw
  in flight vs the limit (must never exceed it).
- optionally (``--transformers N``) N requests through the client against ``transformers serve`` with the tiny
  model, next to the same requests sent with a bare HTTP call (``urllib``): the harness's share of real latency.

Target: added latency under 1 ms per request.

    .venv/bin/python scripts/bench_eval_harness.py [--requests 2000] [--concurrency 32] [--delay 0.02]
        [--transformers 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from recurrent.client import OpenAIChatClient  # noqa: E402
from recurrent.local_server import free_port  # noqa: E402
from taskutils.memory_eval.model_servers import wait_ready  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is the magic number? " * 20}]


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def post(url: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


class InstantServerProcess:
    def __init__(self, delay: float) -> None:
        self.port = free_port()
        cmd = [
            sys.executable,
            str(Path(__file__).with_name("instant_server.py")),
            "--port",
            str(self.port),
            "--served-model-name",
            "instant",
            "--delay",
            str(delay),
        ]
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=REPO)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.root = f"http://127.0.0.1:{self.port}"
        wait_ready(self.base_url, "instant", self.process, timeout=30, interval=0.05)

    def reset(self) -> None:
        post(self.root + "/stats/reset")

    def stats(self) -> dict:
        return get(self.root + "/stats")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait()


def measure(label: str, run, server: InstantServerProcess, n: int, limit: int) -> dict:
    """Run ``run()`` (a coroutine factory returning per-request latencies) and collect the measures."""
    server.reset()
    cpu, wall = time.process_time(), time.perf_counter()
    latencies = asyncio.run(run())
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    stats = server.stats()
    server_ms = 1000 * stats["server_seconds"] / max(1, stats["requests"])
    latency_ms = 1000 * statistics.fmean(latencies)
    return {
        "path": label,
        "concurrency": limit,
        "requests": n,
        "req_per_s": n / wall,
        "latency_ms": latency_ms,
        "server_ms": server_ms,
        "added_ms": latency_ms - server_ms,
        "cpu_ms_per_req": 1000 * cpu / n,
        "max_in_flight": stats["max_in_flight"],
    }


def client_run(base_url: str, n: int, limit: int):
    async def run() -> list[float]:
        client = OpenAIChatClient(base_url, "instant", max_concurrency=limit, timeout=60, max_retries=0)
        async with client:
            await client.chat(MESSAGES, 16)  # connect once: steady state, not connection set-up
            replies = await asyncio.gather(*(client.chat(MESSAGES, 16, temperature=0.7) for _ in range(n)))
        return [r.seconds for r in replies]

    return run


def bare_run(base_url: str, n: int, limit: int):
    """The floor: the same requests with a bare ``httpx`` client (no openai SDK, no retries, no parsing to models)."""
    import httpx2

    async def run() -> list[float]:
        body = {"model": "instant", "messages": MESSAGES, "max_tokens": 16, "temperature": 0.7}
        limits = httpx2.Limits(max_connections=limit, max_keepalive_connections=limit)
        semaphore = asyncio.Semaphore(limit)
        async with httpx2.AsyncClient(limits=limits, timeout=60) as http:

            async def timed_request() -> float:
                async with semaphore:
                    start = time.perf_counter()
                    response = await http.post(base_url + "/chat/completions", json=body)
                    json.loads(response.content)
                    return time.perf_counter() - start

            await timed_request()
            return list(await asyncio.gather(*(timed_request() for _ in range(n))))

    return run


def harness_run(base_url: str, n: int, limit: int, tokenizer, out_dir: Path):
    from recurrent.impls.direct import DirectConfig, DirectWorkflow
    from recurrent.trace import TraceWriter
    from taskutils.memory_eval import scoring
    from taskutils.memory_eval.results import item_record
    from taskutils.memory_eval.runner import run_items

    workflow = DirectWorkflow(DirectConfig(max_input=4096, max_output=16), tokenizer)
    items = [
        {
            "index": i,
            "input": "What is the magic number?",
            "context": "The magic number is 42. " * 10,
            "answers": ["42"],
        }
        for i in range(n)
    ]

    def make_record(item, session, error, seconds):
        gold = scoring.golds(item)
        text = session.history[-1].reply.text if error is None else ""
        scores = scoring.score("hotpotqa", "answer_is", text, gold) if error is None else scoring.failed("hotpotqa")
        return item_record(
            item=item,
            task="hotpotqa",
            length=1,
            model="instant",
            method="direct",
            session=session,
            error=error,
            seconds=seconds,
            scores=scores,
            gold=gold,
        )

    async def run() -> list[float]:
        client = OpenAIChatClient(base_url, "instant", max_concurrency=limit, timeout=60, max_retries=0)
        path = out_dir / f"bench_{limit}.jsonl"
        path.unlink(missing_ok=True)
        async with client:
            await client.chat(MESSAGES, 16)
            with TraceWriter(path) as writer:
                outcome = await run_items(items, workflow.episode, make_record, client, writer, limit)
        assert outcome.done == n and outcome.failed == 0, outcome
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(lines) == n and all(r["sub_em"] == 1 for r in lines)
        return [r["seconds"] for r in lines]  # per item: session build + request + scoring + the line

    return run


def transformers_side_by_side(n: int) -> None:
    from recurrent.local_server import transformers_serve
    from recurrent.models import TINY, materialize

    with transformers_serve(materialize(TINY)) as server:
        body = {"model": server.model, "messages": MESSAGES, "max_tokens": 8, "temperature": 0.7}
        url = server.base_url + "/chat/completions"

        async def run() -> tuple[list[float], list[float]]:
            harness, bare = [], []
            async with OpenAIChatClient(server.base_url, server.model, max_concurrency=1) as client:
                await client.chat(MESSAGES, 8, temperature=0.7)  # warm-up, and the connection is open
                for _ in range(n):  # alternate, so load drift hits both alike
                    start = time.perf_counter()
                    await client.chat(MESSAGES, 8, temperature=0.7)
                    harness.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    post(url, body)  # blocking on purpose: nothing else runs
                    bare.append(time.perf_counter() - start)
            return harness, bare

        harness, bare = asyncio.run(run())
    h, b = 1000 * statistics.median(harness), 1000 * statistics.median(bare)
    print(
        f"\ntransformers serve (tiny model), {n} requests each, concurrency 1, medians: harness client {h:.1f} ms, "
        f"bare urllib {b:.1f} ms, difference {h - b:+.1f} ms ({(h - b) / b:+.1%} of a real model call)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="requests per measurement")
    parser.add_argument("--concurrency", type=int, default=32, help="the concurrency limit under test")
    parser.add_argument("--delay", type=float, default=0.02, help="simulated model seconds for the limit check")
    parser.add_argument("--transformers", type=int, default=0, help="also N requests against transformers serve")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from recurrent.models import TINY, materialize

    tokenizer = AutoTokenizer.from_pretrained(materialize(TINY))
    rows = []
    instant = InstantServerProcess(delay=0.0)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for limit in (1, args.concurrency):
                n = args.requests if limit > 1 else max(200, args.requests // 4)
                rows.append(measure("bare", bare_run(instant.base_url, n, limit), instant, n, limit))
                rows.append(measure("client", client_run(instant.base_url, n, limit), instant, n, limit))
                harness = harness_run(instant.base_url, n, limit, tokenizer, Path(tmp))
                rows.append(measure("harness", harness, instant, n, limit))
    finally:
        instant.stop()
    slow = InstantServerProcess(delay=args.delay)
    try:
        n = 20 * args.concurrency
        limit_row = measure("client", client_run(slow.base_url, n, args.concurrency), slow, n, args.concurrency)
    finally:
        slow.stop()

    print("instant server (its own process; server ms: its handling time per request; at concurrency 32 the latency")
    print("is mostly queueing behind the other requests in the one client event loop: see req/s and CPU ms/req)")
    print(
        f"{'path':8} {'conc':>5} {'requests':>8} {'req/s':>8} {'latency ms':>11} {'server ms':>10} "
        f"{'added ms':>9} {'CPU ms/req':>11}"
    )
    for r in rows:
        cells = f"{r['path']:8} {r['concurrency']:5d} {r['requests']:8d} {r['req_per_s']:8.0f} {r['latency_ms']:11.3f}"
        print(f"{cells} {r['server_ms']:10.3f} {r['added_ms']:9.3f} {r['cpu_ms_per_req']:11.3f}")
    ok = limit_row["max_in_flight"] <= args.concurrency
    print(
        f"\nconcurrency limit {args.concurrency}, server time {1000 * args.delay:.0f} ms, {n} requests: "
        f"max in flight seen by the server {limit_row['max_in_flight']} ({'respected' if ok else 'EXCEEDED'}); "
        f"{limit_row['req_per_s']:.0f} req/s (ideal {args.concurrency / args.delay:.0f})"
    )
    one = {r["path"]: r for r in rows if r["concurrency"] == 1}
    print(
        f"added latency at concurrency 1 (latency - server time): client {one['client']['added_ms']:.3f} ms, "
        f"harness {one['harness']['added_ms']:.3f} ms; a bare httpx request alone costs "
        f"{one['bare']['added_ms']:.3f} ms"
    )
    # The harness's overhead is what it adds to the HTTP round trip any client pays.
    overhead = {p: one[p]["latency_ms"] - one["bare"]["latency_ms"] for p in ("client", "harness")}
    print(
        f"overhead over a bare HTTP request: client {overhead['client']:.3f} ms, harness {overhead['harness']:.3f} ms "
        f"per request (target < 1 ms: {'met' if overhead['harness'] < 1 else 'NOT met'})"
    )
    if args.transformers:
        transformers_side_by_side(args.transformers)
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
