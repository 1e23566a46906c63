"""verl's fp32 log-probabilities on the CPU, its loop over tokens against verl_ext/cpu/logprobs.py's blocks, side by
side in one run.

    OMP_NUM_THREADS=1 python scripts/bench_logprobs.py                  # the replication's sizes
    OMP_NUM_THREADS=1 python scripts/bench_logprobs.py --vocab 49152 --tokens 4096

Each call is what the FSDP engine does with a micro-batch's packed logits (one row per token): the log-probability
of each label, then a backward through it (the update's; the reference policy's pass has no backward, so it is
timed forward only as well). Printed per size: the median of ``--repeat`` calls of each route, their ratio, and the
largest difference in values and gradients. The replication's sizes: its reader's vocabulary (938), ~2,500 tokens
an update's micro-batch on one rank, ~14,000 a reference pass's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verl.utils import torch_functional  # noqa: E402

from verl_ext.cpu.logprobs import logprobs_in_blocks  # noqa: E402

VERL_LOOP = getattr(torch_functional.logprobs_from_logits_v2, "__wrapped__", torch_functional.logprobs_from_logits_v2)


def timed(route, logits: torch.Tensor, labels: torch.Tensor, backward: bool) -> tuple[float, torch.Tensor, object]:
    start = time.perf_counter()
    if backward:
        values = route(logits, labels)
        (grad,) = torch.autograd.grad(values.sum(), logits)
    else:
        with torch.no_grad():
            values, grad = route(logits, labels), None
    return time.perf_counter() - start, values.detach(), grad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=938, help="vocabulary size (default: the replication's reader)")
    parser.add_argument("--tokens", type=int, nargs="+", default=[2500, 14000], help="rows (tokens) per call")
    parser.add_argument("--repeat", type=int, default=5, help="calls per route and size (the median is printed)")
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), vocabulary {args.vocab}")
    print(f"{'tokens':>7} {'pass':>17} {'verl loop (s)':>14} {'blocks (s)':>11} {'ratio':>6} {'max |diff|':>11}")
    for tokens in args.tokens:
        generator = torch.Generator().manual_seed(tokens)
        logits = (3 * torch.randn(tokens, args.vocab, generator=generator)).requires_grad_()
        labels = torch.randint(0, args.vocab, (tokens,), generator=generator)
        for backward in (True, False):
            loop_times, block_times, diff = [], [], 0.0
            for _ in range(args.repeat):  # interleaved, so that a busy moment hits both routes
                t_loop, v_loop, g_loop = timed(VERL_LOOP, logits, labels, backward)
                t_block, v_block, g_block = timed(logprobs_in_blocks, logits, labels, backward)
                loop_times.append(t_loop)
                block_times.append(t_block)
                diff = max(diff, (v_loop - v_block).abs().max().item())
                if backward:
                    diff = max(diff, (g_loop - g_block).abs().max().item())
            loop, block = statistics.median(loop_times), statistics.median(block_times)
            name = "forward+backward" if backward else "forward"
            print(f"{tokens:>7} {name:>17} {loop:>14.4f} {block:>11.4f} {loop / block:>6.1f} {diff:>11.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
