"""The hostile-client soak of ``scripts/bench_serve.py --soak`` (docs/serving.md, "What a request costs"): what a
client, a model and an upstream can send, against endpoints in their own processes, each phase measured for the
endpoint's RSS (before, at its peak, after), how slow ``GET /health`` got meanwhile (asked every 0.2 s on a new
connection), and how soon the endpoint is idle once its clients leave.

- ``requests`` (issue 36): many-message requests whose client leaves once it has sent them, uploads that stall
  half-way, JSON nested 100,000 and 1,000,000 deep, at once, against one slot;
- ``calculator``: the calculator agent, whose model calls ``calculate`` on expressions that are hours of work
  unbounded; and the worst expression the calculator accepts, timed in this process;
- ``connections``: an endpoint whose open-file limit is 1,024: connections that each send a 64 MiB header, then
  1,100 idle connections held open at once, then 1,100 that each send a request's head and one byte of its body
  (issue 63), against the default ``--max-uploads`` and against none (``--max-uploads`` past the connections, as
  before issue 63);
- ``reply``: an upstream whose every reply is 100 MiB.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import socket
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from process_meter import Sampler, cpu_seconds, rss_kib, wait_idle
from served_endpoint import MODEL, QUESTION, Endpoint, body_of, get_json, upstream_and_endpoint

from experiments.calculator.tool import MAX_EXPRESSION_CHARS, calculate
from recurrent.models import TINY, _english_like_corpus, load_tokenizer, resolve_model_path

HOSTILE_EXPRESSIONS = ["(((9**64)**64)**64)**64", "((9**64)**64)**2", "9**64**64", "(-8)**0.5"]


class HealthWatch:
    """``GET /health`` every ``interval`` seconds on a new connection, in a thread: the slowest answer, how many,
    and those that failed (no answer within 10 s, or a status other than 200)."""

    def __init__(self, port: int, interval: float = 0.2) -> None:
        self.url, self.interval = f"http://127.0.0.1:{port}/health", interval
        self.slowest, self.answered, self.failed = 0.0, 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            began = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url, timeout=10) as response:
                    ok = response.status == 200
            except OSError:
                ok = False
            self.slowest = max(self.slowest, time.perf_counter() - began)
            self.answered += ok
            self.failed += not ok

    def __enter__(self) -> HealthWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def figures(self) -> dict[str, Any]:
        return {
            "health_slowest_s": round(self.slowest, 3),
            "health_answered": self.answered,
            "health_failed": self.failed,
        }


def measured(pid: int, port: int, limit: float, work) -> dict[str, Any]:
    """``work()`` with the endpoint's RSS sampled and /health watched; then the seconds until it is idle."""
    before = rss_kib(pid)[0]
    cpu = cpu_seconds(pid)
    with Sampler(pid) as sampler, HealthWatch(port) as watch:
        result = work()
        idle = wait_idle(pid, limit, window=0.25, busy=0.0125)  # seconds from the clients' leaving until idle (5% CPU)
    return {
        **result,
        **watch.figures(),
        "rss_before_mib": round(before / 1024, 1),
        "rss_peak_mib": round(sampler.peak_kib / 1024, 1),
        "rss_after_mib": round(rss_kib(pid)[0] / 1024, 1),
        "cpu_s": round(cpu_seconds(pid) - cpu, 2),
        "s_until_idle": None if idle is None else round(idle, 2),
    }


# ---- requests (issue 36) ----


def many_messages_body(messages: int) -> bytes:
    """A chat of ``messages`` one-KB user messages and a question: the many-messages shape of a long request."""
    block = "\n".join(_english_like_corpus(0, lines=40))[:1000]
    chat = [{"role": "user", "content": block} for _ in range(messages)] + [{"role": "user", "content": QUESTION}]
    return json.dumps({"model": MODEL, "messages": chat, "temperature": 0.0}).encode()


def deep_body(depth: int) -> bytes:
    return ('{"model": "instant", "messages": ' + "[" * depth + "]" * depth + "}").encode()


def raw_post(port: int, body: bytes, length: int | None = None) -> socket.socket:
    """A connection that has sent a chat request's head and ``body`` (which may be part of ``length`` bytes)."""
    connection = socket.create_connection(("127.0.0.1", port))
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
    connection.sendall(f"{head}Content-Length: {length or len(body)}\r\n\r\n".encode() + body)
    return connection


def requests_phase(args: argparse.Namespace, logs: Path, tiny: Path) -> dict[str, Any]:
    """Abandoned many-message requests, stalled uploads and deep JSON at once against one slot, then a normal
    request (docs/serving.md: the issue-36 figures)."""
    abandoned, probe = many_messages_body(args.soak_messages), body_of("A short note about the river.")
    with upstream_and_endpoint(logs / "requests", tiny, ["--max-documents", "1"]) as (_, port, process):
        endpoint = Endpoint(port)
        endpoint.chat(probe)
        log = logs / "requests" / "endpoint.log"
        log_before = log.stat().st_size

        def work() -> dict[str, Any]:
            stalled = [raw_post(port, b'{"messages": [' + b" " * (2 << 20), 8 << 20) for _ in range(args.soak_stalled)]
            for connection in [raw_post(port, abandoned) for _ in range(args.soak_abandoned)]:
                connection.close()  # the client leaves once its request is sent
            left = time.perf_counter()
            depths = [(100_000, 1_000_000)[k % 2] for k in range(args.soak_deep)]
            deep = [endpoint.request("POST", "/v1/chat/completions", deep_body(d))[1] for d in depths]
            status = endpoint.request("POST", "/v1/chat/completions", probe)[1]
            answered = time.perf_counter() - left
            for connection in stalled:
                connection.close()
            return {"deep_statuses": deep, "probe_status": status, "s_until_probe_answered": round(answered, 2)}

        figures = measured(process.pid, port, args.soak_limit, work)
        figures["log_kib_added"] = round((log.stat().st_size - log_before) / 1024, 1)
    return figures


# ---- the calculator ----


def worst_accepted_expression() -> dict[str, Any]:
    """The slowest of the expressions the calculator accepts at its bounds (the largest integers, the longest
    chains of operations on them), and of the hostile ones it refuses, timed here over 200 evaluations each."""
    big = "(9**64)**16"  # 978 digits, just under the bound
    candidates = [big, f"{big}%({big}-1)", f"{big}//(7**64)**16*(7**64)**16"]
    for start, step in ((big, f"//{big}*{big}"), ("1", "*2**64"), ("1", "*9**64%7")):
        chain = start  # the longest chain of the step the bounds accept (characters and operations)
        while len(chain + step) <= MAX_EXPRESSION_CHARS and not calculate(chain + step).startswith("error: more"):
            chain += step
        candidates.append(chain)
    timed = {}
    for expression in [*candidates, *HOSTILE_EXPRESSIONS]:
        began = time.perf_counter()
        for _ in range(200):
            result = calculate(expression)
        timed[expression] = ((time.perf_counter() - began) / 200 * 1000, result.startswith("error"))
    slowest = max((e for e in timed if not timed[e][1]), key=lambda e: timed[e][0])
    return {
        "worst_accepted": slowest,
        "worst_accepted_ms": round(timed[slowest][0], 3),
        "slowest_refused_ms": round(max(ms for ms, refused in timed.values() if refused), 3),
    }


def calculator_phase(args: argparse.Namespace, logs: Path, tiny: Path) -> dict[str, Any]:
    """The calculator agent, its model calling ``calculate`` on an expression that unbounded is hours of work, in
    every call of every request; the budget check of the worst accepted expression."""
    call = json.dumps({"name": "calculate", "arguments": {"expression": HOSTILE_EXPRESSIONS[0]}})
    flags = ["--agent", "calculator", "--max-documents", "4"]
    upstream = ["--reply", f"<tool_call>{call}</tool_call>"]
    with upstream_and_endpoint(logs / "calculator", tiny, flags, upstream) as (_, port, process):
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "What is it?"}]}).encode()

        def work() -> dict[str, Any]:
            began = time.perf_counter()
            statuses = [
                Endpoint(port).request("POST", "/v1/chat/completions", body)[1] for _ in range(args.soak_calculator)
            ]
            return {"statuses": statuses, "s_per_request": round((time.perf_counter() - began) / len(statuses), 3)}

        figures = measured(process.pid, port, args.soak_limit, work)
    return {**figures, **worst_accepted_expression()}


# ---- connections at an open-file limit of 1,024 ----


def header_flood(port: int, size: int) -> int:
    """A request whose header is ``size`` bytes, sent a MiB at a time until the server closes: the bytes sent."""
    connection = socket.create_connection(("127.0.0.1", port))
    sent = 0
    try:
        connection.sendall(b"GET /health HTTP/1.1\r\nHost: soak\r\nX-Flood: ")
        piece = b"a" * (1 << 20)
        while sent < size:
            connection.sendall(piece)
            sent += len(piece)
    except OSError:
        pass
    finally:
        connection.close()
    return sent


def connections_phase(args: argparse.Namespace, logs: Path, tiny: Path) -> dict[str, Any]:
    """Header floods, then ``--soak-idle`` idle connections at once, against an endpoint limited to 1,024 open
    files; the counters its /health reports after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < args.soak_idle + 64:
        raise SystemExit(f"this process may open {hard} files: the soak needs {args.soak_idle + 64}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with upstream_and_endpoint(logs / "connections", tiny, [], open_files=1024) as (_, port, process):

        def floods() -> dict[str, Any]:
            sent = [header_flood(port, 64 << 20) for _ in range(args.soak_floods)]
            return {"flood_mib_sent_before_refused": [round(s / 2**20, 1) for s in sent]}

        flood = measured(process.pid, port, args.soak_limit, floods)

        def idle() -> dict[str, Any]:
            held = [socket.create_connection(("127.0.0.1", port)) for _ in range(args.soak_idle)]
            time.sleep(5)  # held open while /health is asked
            for connection in held:
                connection.close()
            return {}

        idle_figures = measured(process.pid, port, args.soak_limit, idle)
        idle_figures["connections"] = get_json(f"http://127.0.0.1:{port}/health")["connections"]
    figures = {"header_floods": flood, "idle_connections": idle_figures}
    for name, flags in (
        ("stalled_bodies", []),
        ("stalled_bodies_unbounded", ["--max-uploads", "100000", "--max-connections", "908"]),
    ):
        with upstream_and_endpoint(logs / name, tiny, flags, open_files=1024) as (_, port, process):
            figures[name] = measured(process.pid, port, args.soak_limit, lambda port=port: stalled_bodies(args, port))
            figures[name]["connections"] = get_json(f"http://127.0.0.1:{port}/health")["connections"]
    return figures


def stalled_bodies(args: argparse.Namespace, port: int) -> dict[str, Any]:
    """``--soak-idle`` connections that each send a chat request's head and one byte of its 1,000-byte body, held
    5 s while /health is asked; how many of them the server answered 503 meanwhile."""
    held = []
    for _ in range(args.soak_idle):
        with contextlib.suppress(OSError):  # refused or reset on arrival: counted as not held
            held.append(raw_post(port, b"{", 1000))
    time.sleep(5)  # held open while /health is asked
    answered_503 = 0
    for connection in held:
        connection.setblocking(False)
        with contextlib.suppress(OSError):  # nothing received: still held
            answered_503 += connection.recv(16).startswith(b"HTTP/1.1 503")
        connection.close()
    return {"connections_made": len(held), "answered_503": answered_503}


# ---- a 100 MiB upstream reply ----


def reply_phase(args: argparse.Namespace, logs: Path, tiny: Path) -> dict[str, Any]:
    upstream = ["--reply", "x", "--reply-repeat", str(args.soak_reply_mib << 20)]
    with upstream_and_endpoint(logs / "reply", tiny, [], upstream) as (_, port, process):

        def work() -> dict[str, Any]:
            _, status, reply = Endpoint(port).request("POST", "/v1/chat/completions", body_of("A short note."))
            return {"status": status, "code": reply.get("error", {}).get("code")}

        return measured(process.pid, port, args.soak_limit, work)


PHASES = {"requests": requests_phase, "calculator": calculator_phase, "connections": connections_phase,
          "reply": reply_phase}  # fmt: skip


def soak(args: argparse.Namespace) -> int:
    """Every phase asked for (``--soak-phases``), each against endpoints of its own; the figures printed as JSON."""
    tiny = resolve_model_path(TINY)
    load_tokenizer(tiny)  # the offline tokenizer is there before any endpoint loads it
    logs = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    figures = {}
    for phase in args.soak_phases.split(","):
        print(f"soak: {phase} (logs in {logs / phase})", flush=True)
        figures[phase] = PHASES[phase](args, logs, tiny)
        print(json.dumps(figures[phase]), flush=True)
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0
