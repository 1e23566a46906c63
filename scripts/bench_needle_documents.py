"""Benchmark: the needle documents' generator, linear (experiments/needle/needle.py) beside the quadratic one it
replaced (tests/experiments/needle/quadratic_needle.py), on the same documents.

Prints, for each length, the seconds a document takes with each (the same seeds, one after the other in this
process), their ratio, and whether the two wrote the same documents (docs/replication_cpu_notebook.md, "The
documents' generator").

    .venv/bin/python scripts/bench_needle_documents.py [--chunks 64 128 256] [--docs 2] [--tokenizer DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from experiments.needle import needle  # noqa: E402
from experiments.needle.reader import load_or_build_tokenizer  # noqa: E402


def quadratic_generator():
    """The generator as it was, kept beside its test (not a package: loaded from its file)."""
    spec = importlib.util.spec_from_file_location(
        "quadratic_needle", REPO / "tests/experiments/needle/quadratic_needle.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(make, tokenizer, n: int, docs: int) -> tuple[float, list[dict]]:
    t0 = time.perf_counter()
    out = [make(random.Random(f"bench-{n}-{k}"), tokenizer, n, "test") for k in range(docs)]
    return (time.perf_counter() - t0) / docs, out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--docs", type=int, default=2, help="documents a length (each generator)")
    parser.add_argument("--tokenizer", type=Path, help="a reader folder (default: the reader tokenizer, built)")
    args = parser.parse_args(argv)
    tokenizer = load_or_build_tokenizer(args.tokenizer)
    old = quadratic_generator()
    print("| chunks | quadratic s/doc | linear s/doc | ratio | same documents |")
    print("|---|---|---|---|---|")
    for n in args.chunks:
        old_s, old_docs = timed(old.make_document, tokenizer, n, args.docs)
        new_s, new_docs = timed(needle.make_document, tokenizer, n, args.docs)
        print(f"| {n} | {old_s:.2f} | {new_s:.3f} | {old_s / new_s:.0f} | {old_docs == new_docs} |", flush=True)


if __name__ == "__main__":
    main()
