"""Benchmark: vLLM on CPU against our transformers rollout, the same memory-turn burst through each, side by side.

The workload is the CPU replication's rollout (configs/replicate_cpu.yaml): ``train_batch_size x rollout.n``
trajectories at once (16 x 4 = 64 concurrent requests), memory-turn prompts of ~328 tokens (+-10%, random
ordinary token ids, the same for both engines), up to ``recurrent.config.max_memorization_length`` (32) new tokens,
temperature 1, top_p 1, the sampled token's log-prob returned (what the agent loop asks). Through:

- ``hf``: ``HFTokenServer`` (``verl_ext/cpu/hf_server.py``), the engine of the ``hf_cpu`` rollout, fp32, its default
  batching (64 rows a call, prefill in chunks of 128 positions), torch on ``--threads`` threads;
- ``vllm``: vLLM's ``AsyncLLM`` (the engine verl's ``vLLMHttpServer`` runs), token-id prompts, fp32, eager mode,
  ``--kv-cache-gib`` of KV cache (``VLLM_CPU_KVCACHE_SPACE``, as ``configs/cpu_rollout/vllm.yaml``), the trainer's
  ``max_num_seqs`` and ``max_num_batched_tokens`` (configs/recurrent_trainer.yaml), its worker's OpenMP threads
  bound to ``--threads`` cores (``VLLM_CPU_OMP_THREADS_BIND``);
- ``vllm-compile`` (with ``--engines``): the same without eager mode, as the 7B config runs vLLM; on CPU vLLM
  compiles the model with torch inductor at start-up instead of capturing CUDA graphs. ``vllm`` runs vLLM's
  torch.compile'd sampler eagerly (``TORCHDYNAMO_DISABLE=1``, as the CPU trainer's overlay does), ``vllm-compile``
  compiles it too (its inductor kernel crashed an engine now and then here: docs/cluster.md, "vLLM on CPU").

Each engine runs in a subprocess of its own, after a warm-up burst of 2 requests. Per engine: start-up seconds,
the burst's wall seconds, requests/s, generated tokens/s, CPU seconds of its process tree over the burst, and the
peak of its process tree's memory (RSS summed over the processes, and PSS, which counts shared pages once;
sampled every 0.2 s from start-up to the end), then the ratios vllm / hf. Needs vLLM and our code:

    .venv-vllm-cpu/bin/python scripts/bench_rollout_engines.py [--model tiny-head64] [--requests 64]
        [--prompt-tokens 328] [--max-tokens 32] [--threads 1] [--kv-cache-gib 1] [--engines hf vllm vllm-compile]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# vllm-compile: enforce_eager=False, which vLLM's CPU platform compiles with torch inductor (the 7B setting)
ENGINES = ("hf", "vllm", "vllm-compile")
# vllm: the CPU trainer's engine (configs/cpu_rollout/vllm.yaml), its torch.compile'd sampler run eagerly
# (TORCHDYNAMO_DISABLE=1: that inductor kernel crashed engines now and then here); vllm-compile: torch.compile on.
ENGINE_ENV = {"hf": {}, "vllm": {"TORCHDYNAMO_DISABLE": "1"}, "vllm-compile": {"TORCHDYNAMO_DISABLE": "0"}}


def replication_workload() -> dict[str, int]:
    """The CPU replication's rollout burst, read from its run config (concurrency and memory-turn budget)."""
    from omegaconf import OmegaConf

    config = OmegaConf.load(REPO / "configs" / "replicate_cpu.yaml")
    return {
        "requests": int(config.data.train_batch_size) * int(config.actor_rollout_ref.rollout.n),
        "max_tokens": int(config.recurrent.config.max_memorization_length),
    }


def trainer_rollout_limits() -> dict[str, int]:
    """The vLLM scheduler limits every run of the recurrent trainer gives vLLM (the paper's)."""
    from omegaconf import OmegaConf

    rollout = OmegaConf.load(REPO / "configs" / "recurrent_trainer.yaml").actor_rollout_ref.rollout
    return {"max_num_seqs": int(rollout.max_num_seqs), "max_num_batched_tokens": int(rollout.max_num_batched_tokens)}


def rss_and_pss(pid: int) -> tuple[int, int]:
    """A process's RSS and PSS in bytes, from /proc/<pid>/smaps_rollup (the kernel's sums: cheap to read, unlike
    the whole smaps)."""
    sizes = {}
    with open(f"/proc/{pid}/smaps_rollup") as file:
        for line in file:
            name, _, rest = line.partition(":")
            if name in ("Rss", "Pss"):
                sizes[name] = int(rest.split()[0]) * 1024
    return sizes["Rss"], sizes["Pss"]


class TreeMemory:
    """Peak memory of this process and its descendants, sampled from a thread: RSS summed, and PSS."""

    def __init__(self, interval_s: float = 0.2) -> None:
        import psutil

        self._root = psutil.Process()
        self._interval_s = interval_s
        self.peak_rss = self.peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _processes(self) -> list:
        return [self._root, *self._root.children(recursive=True)]

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = pss = 0
            for process in self._processes():
                try:
                    process_rss, process_pss = rss_and_pss(process.pid)
                except (FileNotFoundError, ProcessLookupError, KeyError):
                    continue  # gone meanwhile
                rss, pss = rss + process_rss, pss + process_pss
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            self._stop.wait(self._interval_s)

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the tree's live processes so far."""
        import psutil

        total = 0.0
        for process in self._processes():
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def make_prompts(tokenizer_dir: str, requests: int, prompt_tokens: int) -> list[list[int]]:
    """Random ordinary token ids, ``prompt_tokens`` +-10% each, seed 0: the same prompts for every engine."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    special = set(tokenizer.all_special_ids)
    ordinary = [t for t in range(len(tokenizer)) if t not in special]
    rng = random.Random(0)
    spread = prompt_tokens // 10
    return [
        [rng.choice(ordinary) for _ in range(prompt_tokens + rng.randint(-spread, spread))] for _ in range(requests)
    ]


async def hf_engine(args: argparse.Namespace):
    """HFTokenServer: returns (generate(prompt_ids, index) -> generated ids, close)."""
    import torch

    from verl_ext.cpu.hf_server import HFTokenServer

    torch.set_num_threads(args.threads)
    server = HFTokenServer(args.model_dir)
    params = {"temperature": args.temperature, "top_p": 1.0, "top_k": -1, "logprobs": True}

    async def generate(prompt_ids: list[int], index: int) -> list[int]:
        output = await server.generate(
            f"r{index}", prompt_ids=prompt_ids, sampling_params={**params, "max_tokens": args.max_tokens}
        )
        assert output.log_probs is not None and len(output.log_probs) == len(output.token_ids)
        return output.token_ids

    return generate, lambda: None


async def vllm_engine(args: argparse.Namespace):
    """vLLM's AsyncLLM as verl's vLLMHttpServer drives it: returns (generate, close)."""
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.async_llm import AsyncLLM

    limits = trainer_rollout_limits()
    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=args.model_dir,
            dtype="float32",
            enforce_eager=args.engine == "vllm",
            max_model_len=args.prompt_tokens + args.prompt_tokens // 10 + args.max_tokens,
            max_num_seqs=limits["max_num_seqs"],
            max_num_batched_tokens=limits["max_num_batched_tokens"],
            enable_prefix_caching=True,
            seed=0,
            disable_log_stats=True,
        )
    )
    # verl's vLLM server turns the agent loop's logprobs=True into logprobs=0 (the sampled token's only).
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=1.0, top_k=-1, logprobs=0)

    async def generate(prompt_ids: list[int], index: int) -> list[int]:
        final = None
        async for output in engine.generate(TokensPrompt(prompt_token_ids=prompt_ids), sampling, f"r{index}"):
            final = output
        completion = final.outputs[0]
        assert completion.logprobs is not None and len(completion.logprobs) == len(completion.token_ids)
        return list(completion.token_ids)

    return generate, engine.shutdown


def one_run(args: argparse.Namespace) -> dict:
    """Inside a subprocess: start one engine, warm it up, send the burst; one JSON line of measurements."""
    import asyncio

    memory = TreeMemory()
    prompts = make_prompts(args.model_dir, args.requests, args.prompt_tokens)

    async def measure() -> dict:
        start = time.perf_counter()
        generate, close = await (hf_engine if args.engine == "hf" else vllm_engine)(args)
        await asyncio.gather(*[generate(p, -1 - i) for i, p in enumerate(prompts[:2])])  # warm-up
        startup = time.perf_counter() - start
        cpu_before, begin = memory.cpu_seconds(), time.perf_counter()
        outputs = await asyncio.gather(*[generate(p, i) for i, p in enumerate(prompts)])
        wall, cpu = time.perf_counter() - begin, memory.cpu_seconds() - cpu_before
        close()
        return {"startup_s": startup, "wall_s": wall, "cpu_s": cpu, "new_tokens": sum(map(len, outputs))}

    result = asyncio.run(measure())
    memory.stop()
    return {
        **result,
        "engine": args.engine,
        "requests": len(prompts),
        "prompt_tokens": sum(map(len, prompts)),
        "peak_rss_mb": memory.peak_rss / 2**20,
        "peak_pss_mb": memory.peak_pss / 2**20,
    }


# The CPU replication's reader architecture (experiments/small_reader.py), random weights: as trained (8 heads of
# 16, 4 KV heads; vLLM's CPU attention has no kernel for 16), and with 2 heads of 64 and 1 KV head (the same
# projections' shapes, so the same parameter count; a reader that would have to be trained again to use vLLM).
READERS = {"reader": {"heads": 8, "kv_heads": 4}, "reader-head64": {"heads": 2, "kv_heads": 1}}


def build_reader(name: str, folder: Path) -> None:
    import torch
    from transformers import Qwen2ForCausalLM

    from experiments.needle.reader import build_tokenizer, reader_config

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    Qwen2ForCausalLM(reader_config(tokenizer, **READERS[name])).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def resolve_model(model: str, scratch: Path) -> str:
    """A model folder, an offline model of recurrent.models (materialized if missing) or a reader of READERS
    (built in ``scratch``)."""
    from recurrent.models import KNOWN_MODELS, materialize

    if model in KNOWN_MODELS:
        return str(materialize(model))
    if model in READERS:
        build_reader(model, scratch / model)
        return str(scratch / model)
    if not (Path(model) / "config.json").is_file():
        known = ", ".join((*KNOWN_MODELS, *READERS))
        raise SystemExit(f"--model {model}: neither a model folder (no config.json) nor one of {known}")
    return model


def row(values: list) -> str:
    return " ".join(f"{v:>10}" for v in values)


def report(results: dict[str, dict], args: argparse.Namespace) -> None:
    first = next(iter(results.values()))
    print(
        f"{args.model}: {args.requests} concurrent requests, {first['prompt_tokens'] / args.requests:.0f} prompt "
        f"tokens on average, max_tokens {args.max_tokens}, temperature {args.temperature}, fp32, {args.threads} "
        f"thread(s) each; vLLM {args.kv_cache_gib} GiB KV cache"
    )
    print(row("engine start-s wall-s CPU-s req/s gen-tok/s gen-tok RSS-MB PSS-MB".split()))
    for name, r in results.items():
        print(
            row(
                [
                    name,
                    f"{r['startup_s']:.1f}",
                    f"{r['wall_s']:.2f}",
                    f"{r['cpu_s']:.2f}",
                    f"{r['requests'] / r['wall_s']:.2f}",
                    f"{r['new_tokens'] / r['wall_s']:.1f}",
                    r["new_tokens"],
                    f"{r['peak_rss_mb']:.0f}",
                    f"{r['peak_pss_mb']:.0f}",
                ]
            )
        )
    base = results.get("hf")
    for name, r in results.items():
        if name == "hf" or base is None:
            continue
        per_token_cpu = (r["cpu_s"] / r["new_tokens"]) / (base["cpu_s"] / base["new_tokens"])
        print(
            f"{name} / hf: requests/s {speed(r, 'requests') / speed(base, 'requests'):.2f}x, generated tokens/s "
            f"{speed(r, 'new_tokens') / speed(base, 'new_tokens'):.2f}x, CPU seconds per generated token "
            f"{per_token_cpu:.2f}x, peak RSS {r['peak_rss_mb'] / base['peak_rss_mb']:.2f}x, peak PSS "
            f"{r['peak_pss_mb'] / base['peak_pss_mb']:.2f}x, start-up {r['startup_s'] / base['startup_s']:.1f}x"
        )


def speed(result: dict, what: str) -> float:
    return result[what] / result["wall_s"]


def main(argv: list[str] | None = None) -> int:
    workload = replication_workload()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", default="tiny-head64", help="a model folder, an offline model, or reader / reader-head64 (READERS)"
    )
    parser.add_argument("--requests", type=int, default=workload["requests"], help="concurrent requests")
    parser.add_argument("--prompt-tokens", type=int, default=328, help="mean prompt length (+-10%%, uniform)")
    parser.add_argument("--max-tokens", type=int, default=workload["max_tokens"], help="max new tokens per request")
    parser.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (hf), bound cores (vllm)")
    parser.add_argument("--kv-cache-gib", type=int, default=1, help="vLLM's KV cache (VLLM_CPU_KVCACHE_SPACE)")
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=["hf", "vllm"], help="which to run")
    parser.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.requests < 1 or args.max_tokens < 1 or args.prompt_tokens < 1 or args.threads < 1:
        parser.error("--requests, --prompt-tokens, --max-tokens and --threads must be at least 1")
    if args.one_run:
        print(json.dumps(one_run(args)))
        return 0

    with tempfile.TemporaryDirectory() as scratch:
        args.model_dir = resolve_model(args.model, Path(scratch))
        # vLLM's sampler compiles a kernel with inductor on CPU: a cache of this run's own, not the shared one that
        # other runs write at the same time (as scripts/train_tiny_cpu.sh does)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(scratch) / "inductor_cache")
        return run_engines(args)


def run_engines(args: argparse.Namespace) -> int:
    """Each engine of ``args.engines`` in a subprocess of its own, then the table."""
    from verl_ext.cpu.vllm_cpu import model_problem

    if set(args.engines) - {"hf"} and (problem := model_problem(args.model_dir)):
        raise SystemExit(f"error: {problem}")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(args.threads),
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    common = ["--model-dir", args.model_dir, "--requests", str(args.requests), "--threads", str(args.threads)]
    common += ["--prompt-tokens", str(args.prompt_tokens), "--max-tokens", str(args.max_tokens)]
    common += ["--temperature", str(args.temperature), "--kv-cache-gib", str(args.kv_cache_gib)]
    results = {}
    for engine in args.engines:
        out = subprocess.run(
            [sys.executable, __file__, "--one-run", "--engine", engine, *common],
            capture_output=True,
            text=True,
            env={**env, **ENGINE_ENV[engine]},
        )
        if out.returncode != 0:
            print((out.stdout + out.stderr)[-12000:], file=sys.stderr)  # vLLM logs to stdout
            raise SystemExit(f"error: the {engine} run failed (exit status {out.returncode}); its output is above")
        results[engine] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"  {engine}: {results[engine]['wall_s']:.2f} s", flush=True)
    report(results, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
