"""Benchmark: the memory and time of ``python -m taskutils.memory_data custom --tokenizer tiny`` against the size
of one record's context, with and without white space (taskutils/memory_data/README.md, "Your own data").

Each size runs the converter in a fresh process on one JSON-lines record whose context is one line of N MB: words
of random letters between single spaces (``spaced``), or random letters with no white space at all (``unbroken``,
one "word" for the tokenizer: the case that used to be tokenized whole, at ~190 bytes of memory a character).
Printed per run: the wall time, the process's peak RSS (``wait4``'s ``ru_maxrss``), and the peak over a run on a
1 KB context (what the interpreter, the libraries and the tokenizer take): the difference is what the record
costs, also as a multiple of its size.

    .venv/bin/python scripts/bench_custom_data.py [--mb 1,2,5] [--kinds spaced,unbroken] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def context(kind: str, chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    if kind == "unbroken":
        return "".join(rng.choices(LETTERS, k=chars))
    words = ["".join(rng.choices(LETTERS, k=rng.randint(2, 9))) for _ in range(5000)]
    return " ".join(rng.choices(words, k=chars // 6 + 1))[:chars]


def convert(kind: str, chars: int, folder: Path) -> tuple[float, int]:
    """(wall s, peak RSS in bytes) of the converter on one record with a context of ``chars`` characters."""
    source = folder / f"{kind}-{chars}.jsonl"
    record = {"question": "What is the magic number?", "answers": ["42"], "context": context(kind, chars)}
    source.write_text(json.dumps(record) + "\n")
    command = [sys.executable, "-m", "taskutils.memory_data", "custom", str(source), "--tokenizer", "tiny"]
    command += ["--train-out", str(folder / "train.parquet")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    began = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - began
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"the converter failed on {source}: {process.stderr.read().decode()[-2000:]}")
    process.stderr.close()
    source.unlink()
    return wall, usage.ru_maxrss * 1024  # KiB on Linux


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", default="1,2,5", help="context sizes in MiB, comma list")
    parser.add_argument("--kinds", default="spaced,unbroken", help="spaced and/or unbroken, comma list")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    sizes = [float(x) for x in args.mb.split(",")]
    kinds = args.kinds.split(",")
    if set(kinds) - {"spaced", "unbroken"}:
        parser.error(f"--kinds: spaced and/or unbroken, got {args.kinds}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-custom-") as tmp:
        folder = Path(tmp)
        base_wall, base_peak = convert("spaced", 1024, folder)
        print(f"1 KB context: {base_wall:.1f} s, peak RSS {base_peak / 2**20:.0f} MiB (the process alone)", flush=True)
        for mb in sizes:
            for kind in kinds:
                chars = int(mb * 2**20)
                wall, peak = convert(kind, chars, folder)
                row = {
                    "kind": kind,
                    "context_mib": mb,
                    "seconds": wall,
                    "peak_rss_mib": peak / 2**20,
                    "over_base_mib": (peak - base_peak) / 2**20,
                    "over_base_x_input": (peak - base_peak) / chars,
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\n| context | MiB | seconds | peak RSS (MiB) | over the 1 KB run (MiB) | x the context |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['kind']} | {r['context_mib']:g} | {r['seconds']:.1f} | {r['peak_rss_mib']:.0f} | "
            f"{r['over_base_mib']:.0f} | {r['over_base_x_input']:.1f} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"base_peak_rss_mib": base_peak / 2**20, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
