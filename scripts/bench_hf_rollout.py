"""Benchmark: the CPU rollout server (``verl_ext/cpu/hf_server.py``) with batching off and on.

A burst of concurrent requests as the memory agent loop sends them during CPU training (64 trajectories at once,
~330-token prompts, up to 32 new tokens, temperature 1 with log-probs) to ``HFTokenServer`` with
``max_batch_size=1`` (``off``: one request per ``model.generate`` call, the server before batching) and with
batching (``max_batch_size=64``; ``on``: the prompts read in chunks of 128 positions, the server's default;
``on-1pass``: in one pass). The model is the replication's ~1M-parameter Qwen2 reader
(``experiments.needle.reader``) with random weights, or ``--model DIR``. One torch thread.

Each run is a subprocess of its own (so its peak RSS is its own); the modes alternate and each keeps its fastest
run (other load on the machine only slows runs down). Prints the burst's wall and CPU seconds, requests/s, new
tokens/s, model.generate calls, the peak RSS (``rise``: minus the RSS before the burst) and the speed-up.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_hf_rollout.py [--requests 64] [--prompt-tokens 330]
        [--max-tokens 32] [--repeats 2] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from verl_ext.cpu.hf_server import DEFAULT_PREFILL_CHUNK  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def one_run(args: argparse.Namespace) -> dict:
    """Inside a subprocess: the burst against one server; prints one JSON line of measurements."""
    import asyncio
    import random

    import torch

    from verl_ext.cpu.hf_server import HFTokenServer

    torch.set_num_threads(1)
    server = HFTokenServer(args.model_dir, max_batch_size=args.batch, prefill_chunk_size=args.chunk or None)
    vocab = len(server.tokenizer)
    special = set(server.tokenizer.all_special_ids)
    rng = random.Random(0)
    ordinary = [t for t in range(vocab) if t not in special]
    spread = args.prompt_tokens // 10
    prompts = [
        [rng.choice(ordinary) for _ in range(args.prompt_tokens + rng.randint(-spread, spread))]
        for _ in range(args.requests)
    ]
    params = {"temperature": args.temperature, "top_p": 1.0, "top_k": -1, "logprobs": True}

    async def burst(prompts: list[list[int]]) -> list:
        return await asyncio.gather(
            *[
                server.generate(str(i), prompt_ids=p, sampling_params={**params, "max_tokens": args.max_tokens})
                for i, p in enumerate(prompts)
            ]
        )

    asyncio.run(burst(prompts[:2]))  # warm-up: first calls initialise kernels
    calls = server.generate_calls
    before = rss_mb()
    start, cpu_start = time.perf_counter(), time.process_time()
    outputs = asyncio.run(burst(prompts))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "requests": len(outputs),
        "new_tokens": sum(len(o.token_ids) for o in outputs),
        "prompt_tokens": sum(len(p) for p in prompts),
        "generate_calls": server.generate_calls - calls,
        "parameters": sum(p.numel() for p in server.model.parameters()),
        "rss_before_mb": before,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def build_model(folder: Path) -> None:
    """The reader with random weights (seed 0) and its tokenizer, saved to ``folder``."""
    import torch
    from transformers import Qwen2ForCausalLM

    from experiments.needle.reader import build_tokenizer, reader_config

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    Qwen2ForCausalLM(reader_config(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=64, help="concurrent requests in the burst")
    parser.add_argument("--prompt-tokens", type=int, default=330, help="mean prompt length (+-10%%, uniform)")
    parser.add_argument("--max-tokens", type=int, default=32, help="max new tokens per request")
    parser.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    parser.add_argument("--max-batch-size", type=int, default=64, help="the batching run's max_batch_size")
    parser.add_argument("--repeats", type=int, default=2, help="runs per mode, alternating; the fastest counts")
    parser.add_argument("--model", help="a model folder (default: the reader with random weights)")
    parser.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--chunk", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_run:
        print(json.dumps(one_run(args)))
        return 0

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model or str(Path(scratch) / "reader")
        if args.model is None:
            build_model(Path(model_dir))
        common = ["--model-dir", model_dir, "--requests", str(args.requests)]
        common += ["--prompt-tokens", str(args.prompt_tokens), "--max-tokens", str(args.max_tokens)]
        common += ["--temperature", str(args.temperature)]
        # (max_batch_size, prefill_chunk_size; 0: one pass)
        modes = {
            "off": (1, 0),
            "on": (args.max_batch_size, DEFAULT_PREFILL_CHUNK),
            "on-1pass": (args.max_batch_size, 0),
        }
        results: dict[str, dict] = {}
        for _ in range(args.repeats):
            for label, (batch, chunk) in modes.items():
                out = subprocess.run(
                    [sys.executable, __file__, "--one-run", "--batch", str(batch), "--chunk", str(chunk), *common],
                    check=True,
                    capture_output=True,
                    text=True,
                    env=env,
                )
                run = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"  batching {label}: {run['wall_s']:.2f} s", flush=True)
                if label not in results or run["wall_s"] < results[label]["wall_s"]:
                    results[label] = run

    first = next(iter(results.values()))
    print(
        f"HFTokenServer, {first['parameters'] / 1e6:.2f}M-parameter Qwen2 ({args.model or 'reader, random weights'}), "
        f"1 thread: {args.requests} concurrent requests, {first['prompt_tokens'] / args.requests:.0f} prompt tokens "
        f"on average, max_tokens {args.max_tokens}, temperature {args.temperature}; fastest of {args.repeats}"
    )
    columns = "batching max-batch chunk calls wall-s CPU-s req/s new-tok/s new-tok RSS-MB rise-MB".split()
    print(" ".join(f"{c:>9}" for c in columns))
    for label, r in results.items():
        batch, chunk = modes[label]
        row = [label, batch, chunk or "-", r["generate_calls"], f"{r['wall_s']:.2f}", f"{r['cpu_s']:.2f}"]
        row += [f"{r['requests'] / r['wall_s']:.2f}", f"{r['new_tokens'] / r['wall_s']:.1f}", r["new_tokens"]]
        row += [f"{r['max_rss_mb']:.0f}", f"{r['max_rss_mb'] - r['rss_before_mb']:.0f}"]
        print(" ".join(f"{v:>9}" for v in row))
    off = results["off"]
    for label in ("on", "on-1pass"):
        on = results[label]
        speedup = (on["requests"] / on["wall_s"]) / (off["requests"] / off["wall_s"])
        print(
            f"{label} / off: speed-up (requests/s) {speedup:.2f}x, CPU time {off['cpu_s'] / on['cpu_s']:.2f}x less, "
            f"peak RSS {on['max_rss_mb'] / off['max_rss_mb']:.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
