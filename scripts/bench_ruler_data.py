"""Benchmark RULER data generation: throughput (tokens/s) and peak memory at 128K and at 1M tokens.

Each length runs in a fresh subprocess, so the peaks are separate. Peak memory is the process's maximum
resident set size (``resource.getrusage(RUSAGE_SELF).ru_maxrss``), which includes the interpreter,
transformers and the tokenizer; the set-up baseline (the same measure right before the first sample) is
printed too. Target: peak RSS at 1M within 2x of that at 128K.

    .venv/bin/python scripts/bench_ruler_data.py                      # niah_single_1, tiny tokenizer
    .venv/bin/python scripts/bench_ruler_data.py --task niah_single_2 --essay-file data/sources/PaulGrahamEssays.json
    .venv/bin/python scripts/bench_ruler_data.py --tokenizer qwen2.5 --samples 4
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def child(args: argparse.Namespace) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from taskutils.memory_data import stages
    from taskutils.memory_data.ruler import Sources
    from taskutils.memory_data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    sources = Sources(essay=args.essay_file, squad=args.squad_file, hotpotqa_dev=args.hotpotqa_dev_file)
    baseline = peak_rss_mb()
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        report = stages.ruler(
            Path(out), args.task, args.length, tokenizer, args.tokenizer, args.samples, 42, sources, progress=False
        )
        seconds = time.perf_counter() - start
        lengths = [json.loads(line)["length"] for line in report.output.read_text().splitlines()]
    print(
        json.dumps(
            {
                "length": args.length,
                "samples": args.samples,
                "tokens": sum(lengths),
                "seconds": seconds,
                "tokens_per_s": sum(lengths) / seconds,
                "min_ratio": min(lengths) / args.length,
                "baseline_mb": baseline,
                "peak_mb": peak_rss_mb(),
            }
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="niah_single_1")
    parser.add_argument("--tokenizer", default="tiny", help="tokenizer spec (see --tokenizer of the ruler command)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[131072, 1048576])
    parser.add_argument("--samples", type=int, default=2, help="samples per length")
    parser.add_argument("--essay-file", type=Path, default=None)
    parser.add_argument("--squad-file", type=Path, default=None)
    parser.add_argument("--hotpotqa-dev-file", type=Path, default=None)
    parser.add_argument("--length", type=int, default=None, help=argparse.SUPPRESS)  # set in the child process
    args = parser.parse_args()
    if args.length is not None:
        child(args)
        return 0

    results = []
    for length in args.lengths:
        cmd = [sys.executable, __file__, "--length", str(length), "--task", args.task, "--tokenizer", args.tokenizer]
        cmd += ["--samples", str(args.samples)]
        for flag in ("essay_file", "squad_file", "hotpotqa_dev_file"):
            if getattr(args, flag) is not None:
                cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return done.returncode
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))

    print(f"task {args.task}, tokenizer {args.tokenizer}, {args.samples} samples per length, peak = max RSS")
    print(f"{'target':>9} {'tokens/s':>10} {'s/sample':>9} {'min len/target':>15} {'baseline MB':>12} {'peak MB':>9}")
    for r in results:
        print(
            f"{r['length']:>9} {r['tokens_per_s']:>10,.0f} {r['seconds'] / r['samples']:>9.2f} "
            f"{r['min_ratio']:>15.4f} {r['baseline_mb']:>12.0f} {r['peak_mb']:>9.0f}"
        )
    if len(results) >= 2:
        ratio = results[-1]["peak_mb"] / results[0]["peak_mb"]
        verdict = "within" if ratio <= 2 else "NOT within"
        print(f"peak memory {results[-1]['length']} / {results[0]['length']}: {ratio:.2f}x ({verdict} the 2x target)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
