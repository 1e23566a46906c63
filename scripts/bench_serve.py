"""Benchmark: what the OpenAI-compatible endpoint (``python -m taskutils.endpoint``) costs over calling the memory
agent in process, per request and in memory, up to a 3.5M-token request (docs/third_party_eval.md, "What the
endpoint costs").

Both paths run the same memory agent (``recurrent.impls.memory.inference_workflow``, the paper's budgets by
default: 5000-token chunks, 1024-token memory and answer) against the same upstream, an OpenAI-compatible server
that answers instantly (``scripts/instant_server.py``, which reports its own time per call), so what
separates the two paths is the endpoint's own work: the HTTP hop, reading and parsing the request, the hand-over
of a long document's tokenization to a worker thread, writing the response. Measured side by side in one run, one
request at a time, the two paths alternating which goes first (so drift in the machine's load hits both):

- (a) in process: tokenize the document, run the memory loop through ``recurrent.client.OpenAIChatClient``;
- (b) through the endpoint: one ``POST /v1/chat/completions`` with the document and the question in one user
  message (the body is serialized before the clock starts: that is the client's cost, not the endpoint's).

Every pair is checked: same answer, same number of upstream calls. Printed per document length: the median wall
time of (a) and (b); the difference (b) - (a) per request as the median and p90 over the pairs and as best-of-N
(min (b) - min (a): the least disturbed run of each, as ``timeit`` reports); the CPU time of (a) (this process)
and of the endpoint process for (b), per request (``/proc/PID/task/*/schedstat``, all threads, exact to the
nanosecond; ``/proc/PID/stat``'s 10 ms ticks where a thread ended during the request), and their difference: a
figure that a loaded machine disturbs much less than wall time; the upstream's own time per request; the endpoint
process's peak RSS while it served that length (peak reset before each length through ``/proc/PID/clear_refs``;
its idle RSS is printed too). Targets: the endpoint adds under 1 ms per request beyond the upstream's time, and its
memory is flat in document length (a body over ``--spool-bytes``, 1 MiB by default, is held on disk: docs/serving.md,
"Long requests").

The tokenizer is the offline ``tiny`` model's (no download); documents are English-like synthetic text, or with
``--text unbroken`` random letters without any white space (one "word" for the tokenizer, which the endpoint once
tokenized whole, at ~190 bytes of memory a character: docs/serving.md, "Long requests").

    .venv/bin/python scripts/bench_serve.py [--tokens 5000,50000,500000,3500000] [--repeats 30,10,4,2]
        [--chunk 5000 --max-new 1024 --final-max-new 1024] [--text english|unbroken] [--json FILE]

``--soak``: hostile clients at once against an endpoint with one slot (bounded in count, ``--soak-*``, and in time,
``--soak-limit``): many-message requests whose client leaves once it has sent them, uploads that stall half-way,
JSON nested 100,000 and 1,000,000 deep; printed: the endpoint's RSS before, at its peak and after, its CPU seconds,
the seconds until a normal request is answered and until its CPU is idle again, and what its log grew by.

    .venv/bin/python scripts/bench_serve.py --soak [--soak-abandoned 3 --soak-messages 60000 --soak-stalled 4
        --soak-deep 4 --soak-limit 300] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from process_meter import cpu_between, cpu_seconds, reset_peak, rss_kib, thread_cpu  # noqa: E402
from served_endpoint import MODEL, QUESTION, Endpoint, body_of, get_json, upstream_and_endpoint  # noqa: E402

from recurrent.async_manager import run_session  # noqa: E402
from recurrent.client import OpenAIChatClient  # noqa: E402
from recurrent.impls.memory import inference_workflow  # noqa: E402
from recurrent.models import TINY, _english_like_corpus, load_tokenizer, resolve_model_path  # noqa: E402

FLOOR_REQUESTS = 50  # requests of the HTTP stack alone, each kind


def make_document(tokenizer: Any, tokens: int, text: str = "english") -> str:
    """English-like text of about ``tokens`` tokens: a block of the tiny model's corpus generator (~350 tokens),
    repeated (the exact count is what the agent reports; tokenizing a 3.5M-token text again and again to hit a
    count exactly would take minutes); ``unbroken``: a block of 4096 random letters, repeated (no white space)."""
    if text == "unbroken":
        block = "".join(random.Random(0).choices("abcdefghijklmnopqrstuvwxyz", k=4096))
    else:
        block = "\n".join(_english_like_corpus(0, lines=20)) + "\n"
    per_block = len(tokenizer.encode(block, add_special_tokens=False))
    return block * max(1, round(tokens / per_block))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="5000,50000,500000,3500000", help="document lengths, comma list")
    parser.add_argument("--repeats", default="30,10,4,2", help="request pairs per length, comma list")
    parser.add_argument("--chunk", type=int, default=5000)
    parser.add_argument("--max-new", type=int, default=1024)
    parser.add_argument("--final-max-new", type=int, default=1024)
    parser.add_argument("--text", choices=("english", "unbroken"), default="english", help="the documents' text")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--soak", action="store_true", help="the hostile-client soak instead (docs/serving.md)")
    parser.add_argument("--soak-abandoned", type=int, default=3, help="many-message requests whose client leaves")
    parser.add_argument("--soak-messages", type=int, default=60_000, help="one-KB messages in each of them")
    parser.add_argument("--soak-stalled", type=int, default=4, help="uploads that stop after 2 MB of 8 MB")
    parser.add_argument("--soak-deep", type=int, default=4, help="requests of JSON nested 100,000+ deep")
    parser.add_argument("--soak-limit", type=float, default=300.0, help="seconds the soak waits for idle, at most")
    parser.add_argument("--soak-floods", type=int, default=6, help="connections that each send a 64 MiB header")
    parser.add_argument("--soak-idle", type=int, default=1100, help="idle connections, against an fd limit of 1,024")
    parser.add_argument("--soak-reply-mib", type=int, default=100, help="MiB of the upstream's huge reply")
    parser.add_argument("--soak-calculator", type=int, default=40, help="requests whose model calls the calculator")
    parser.add_argument(
        "--soak-phases", default="requests,calculator,connections,reply", help="the soak's phases, comma list"
    )
    args = parser.parse_args(argv)
    if not args.soak:
        args.lengths = [int(x) for x in args.tokens.split(",")]
        args.pair_counts = [int(x) for x in args.repeats.split(",")]
        if len(args.pair_counts) != len(args.lengths):
            parser.error("--repeats needs one count per --tokens length")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.soak:
        from serve_soak import soak  # the hostile-client soak: its own module

        return soak(args)
    return overhead(args)


# ---------------------------------------------------------------------------------------------------------------
# what the endpoint adds (the default)
# ---------------------------------------------------------------------------------------------------------------


class SideBySide:
    """One request both ways against the same upstream: (a) the memory agent in this process, (b) the endpoint
    (process ``pid``); each measured with the upstream's own calls and time."""

    def __init__(self, workflow: Any, upstream_root: str, endpoint: Endpoint, pid: int) -> None:
        self.workflow, self.upstream_root, self.endpoint, self.pid = workflow, upstream_root, endpoint, pid
        self.client = OpenAIChatClient(f"{upstream_root}/v1", MODEL, max_concurrency=1, max_retries=0)
        self.loop = asyncio.new_event_loop()

    def upstream_stats(self) -> tuple[int, float]:
        stats = get_json(f"{self.upstream_root}/stats")
        return stats["requests"], stats["server_seconds"]

    def in_process(self, document: str) -> tuple[float, float, str, int, float, int]:
        """(wall s, CPU s, answer, upstream calls, upstream s, document tokens) of one pass in this process."""
        calls, upstream = self.upstream_stats()
        wall, cpu = time.perf_counter(), time.process_time()
        session = self.workflow.episode({"input": QUESTION, "context": document})
        self.loop.run_until_complete(run_session(session, self.client, {"temperature": 0.0}))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        calls_after, upstream_after = self.upstream_stats()
        tokens = session.original_context_tokens
        return wall, cpu, session.answer, calls_after - calls, upstream_after - upstream, tokens

    def served(self, body: bytes) -> tuple[float, float, str, int, float]:
        """(wall s, the endpoint's CPU s, answer, upstream calls, upstream s) of one request to the endpoint."""
        pid = self.pid
        calls, upstream = self.upstream_stats()
        before = (*thread_cpu(pid), cpu_seconds(pid))
        wall, reply = self.endpoint.chat(body)
        cpu = cpu_between(before, (*thread_cpu(pid), cpu_seconds(pid)))
        calls_after, upstream_after = self.upstream_stats()
        answer = reply["choices"][0]["message"]["content"]
        return wall, cpu, answer, calls_after - calls, upstream_after - upstream

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()


def http_floor(endpoint: Endpoint, tokenizer: Any, tokens: int) -> dict[str, float]:
    """The HTTP stack's own round trip, no agent, median ms: GET /v1/models, and a ``tokens``-token request refused
    for naming another model (its body read and parsed, then a 404)."""
    refused = body_of(make_document(tokenizer, tokens), model="another")
    floors = {
        "get_models_ms": [endpoint.request("GET", "/v1/models") for _ in range(FLOOR_REQUESTS)],
        "post_refused_ms": [endpoint.request("POST", "/v1/chat/completions", refused) for _ in range(FLOOR_REQUESTS)],
    }
    if {r[1] for r in floors["get_models_ms"]} != {200} or {r[1] for r in floors["post_refused_ms"]} != {404}:
        raise RuntimeError("the HTTP-stack requests did not answer 200 and 404")
    return {name: 1000 * statistics.median(r[0] for r in replies) for name, replies in floors.items()}


def measure_length(paths: SideBySide, tokenizer: Any, tokens: int, count: int, text: str) -> dict[str, Any]:
    """``count`` pairs of one document of about ``tokens`` tokens, the two paths alternating which goes first
    (drift in the machine's load hits both); every pair checked to agree. The endpoint's peak RSS is reset first."""
    document = make_document(tokenizer, tokens, text)
    body = body_of(document)
    reset_peak(paths.pid)
    walls_a, walls_b, cpus_a, cpus_b, diffs, upstream_ms = [], [], [], [], [], []
    for pair in range(count):
        if pair % 2:
            b = paths.served(body)
            a = paths.in_process(document)
        else:
            a = paths.in_process(document)
            b = paths.served(body)
        wall_a, cpu_a, answer, calls, upstream_a, doc_tokens = a
        wall_b, cpu_b, reply, calls_b, upstream_b = b
        if reply != answer or calls_b != calls:
            raise RuntimeError(f"the paths differ: {answer!r} in {calls} calls, {reply!r} in {calls_b}")
        walls_a.append(wall_a)
        walls_b.append(wall_b)
        cpus_a.append(cpu_a)
        cpus_b.append(cpu_b)
        diffs.append(wall_b - wall_a)
        upstream_ms.append(1000 * (upstream_a + upstream_b) / 2)  # the upstream's time per request
    rss, peak = rss_kib(paths.pid)
    return {
        "tokens": doc_tokens,
        "document_mib": len(document) / 2**20,
        "upstream_calls": calls,
        "pairs": count,
        "in_process_s": statistics.median(walls_a),
        "endpoint_s": statistics.median(walls_b),
        "added_ms_median": 1000 * statistics.median(diffs),
        "added_ms_p90": 1000 * percentile(diffs, 0.9),
        "added_ms_best": 1000 * (min(walls_b) - min(walls_a)),  # best of N each: the least disturbed
        "in_process_cpu_ms": 1000 * statistics.fmean(cpus_a),
        "endpoint_cpu_ms": 1000 * statistics.fmean(cpus_b),
        "added_cpu_ms": 1000 * (statistics.fmean(cpus_b) - statistics.fmean(cpus_a)),
        "upstream_ms": statistics.median(upstream_ms),
        "peak_rss_mib": peak / 1024,
        "rss_after_mib": rss / 1024,
    }


def print_table(rows: list[dict[str, Any]], idle_rss: int, floors: dict[str, float], first_length: int) -> None:
    print()
    print(
        "| document tokens | MiB | upstream calls | pairs | in process (s) | endpoint (s) | added ms, median | "
        "added ms, p90 | added ms, best | CPU ms in process | CPU ms endpoint | added CPU ms | upstream ms | "
        "endpoint peak RSS (MiB) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['tokens']:,} | {r['document_mib']:.1f} | {r['upstream_calls']} | {r['pairs']} | "
            f"{r['in_process_s']:.3f} | {r['endpoint_s']:.3f} | {r['added_ms_median']:.2f} | {r['added_ms_p90']:.2f} | "
            f"{r['added_ms_best']:.2f} | "
            f"{r['in_process_cpu_ms']:.1f} | {r['endpoint_cpu_ms']:.1f} | {r['added_cpu_ms']:.1f} | "
            f"{r['upstream_ms']:.1f} | {r['peak_rss_mib']:.0f} |"
        )
    print(f"\nendpoint idle RSS: {idle_rss / 1024:.0f} MiB")
    print(
        f"HTTP stack alone (median of {FLOOR_REQUESTS}): GET /v1/models {floors['get_models_ms']:.2f} ms; the "
        f"{first_length:,}-token request refused (404, body read and parsed) {floors['post_refused_ms']:.2f} ms"
    )


def overhead(args: argparse.Namespace) -> int:
    """Both paths side by side at each length: warm-up, the HTTP stack's floor, then the pairs of each length."""
    tiny = resolve_model_path(TINY)
    tokenizer = load_tokenizer(tiny)
    workflow = inference_workflow(tokenizer, args.chunk, args.max_new, args.final_max_new)
    logs = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    budgets = ["--chunk-size", str(args.chunk), "--max-new", str(args.max_new),
               "--final-max-new", str(args.final_max_new)]  # fmt: skip
    rows = []
    with upstream_and_endpoint(logs, tiny, budgets) as (upstream_root, port, process):
        paths = SideBySide(workflow, upstream_root, Endpoint(port), process.pid)
        warm = make_document(tokenizer, 2 * args.chunk)  # connections, caches and imports of both paths
        for _ in range(3):
            paths.in_process(warm)
            paths.served(body_of(warm))
        idle_rss = rss_kib(process.pid)[0]
        print(f"endpoint pid {process.pid}: idle RSS {idle_rss / 1024:.1f} MiB", flush=True)
        floors = http_floor(paths.endpoint, tokenizer, args.lengths[0])
        print(json.dumps(floors), flush=True)
        for tokens, count in zip(args.lengths, args.pair_counts, strict=True):
            rows.append(measure_length(paths, tokenizer, tokens, count, args.text))
            print(json.dumps(rows[-1]), flush=True)
        paths.close()
    print_table(rows, idle_rss, floors, args.lengths[0])
    if args.json:
        figures = {"idle_rss_mib": idle_rss / 1024, "http_floor": floors, "rows": rows}
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
