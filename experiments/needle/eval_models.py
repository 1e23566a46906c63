"""The replication's readers in the evaluation harness: a model table for ``python -m taskutils.memory_eval.run``.

    python -m experiments.needle.eval_models --out readers.yaml warm-start=DIR rl-seed0=DIR rl-seed1=DIR ...
    python -m taskutils.memory_eval.run --table readers.yaml --tasks needle --data-dir DATA/eval/test \\
        --method memory-boxed,direct-boxed --temperature 0 --results-dir results/replication

Every ``NAME=FOLDER`` (a reader model folder: weights, tokenizer and chat template) becomes one entry with the
budgets of the replication's agent (:func:`experiments.needle.warm_start.agent_config`: 64-token chunks, a
32-token memory, a 16-token boxed final answer), method ``memory-boxed``, served by ``transformers serve`` on CPU.
The table is written at run time (checkpoint folders are machine paths, kept out of the repository); the budgets
come from the same constants as training, so the evaluation cannot drift from them.

Serving. ``transformers serve`` without options runs one ``generate`` call at a time; with
``--continuous-batching`` it batches the requests in flight (paged attention), and for greedy decoding gives the
same tokens as one request at a time (measurements: taskutils/memory_eval/README.md, "The CPU replication").
Its CPU attention (``paged|sdpa``) attends every query of a step to the keys of *every* request of the step and
masks the others out, so its cost grows with the square of the requests in flight: 8 in flight was fastest
(server CPU per memory turn 54-61 ms, against 110 ms one at a time). The KV cache is sized here (the default
sizes it from the machine's memory: ~4 GB and ~50 s to set up): 1024 blocks of 32 tokens hold 32K tokens, ~64 MB
for the reader, room for ~70 prompts of the 416-token window. With batching, every request of a run shares the
first request's sampling settings (fine for one temperature per run; greedy is exact).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from experiments.needle.warm_start import CHUNK_SIZE, FINAL_TOKENS, MEMORY_TOKENS

GROUP = "replication"
CONCURRENCY = 8  # requests in flight with continuous batching (the fastest measured; see the module docstring)
BATCHING_ARGS = (
    "--continuous-batching",
    "--cb-block-size",
    "32",
    "--cb-num-blocks",
    "1024",
    "--cb-max-batch-tokens",
    "1024",
)
# The reader's window is its training context: 416 tokens, the RL rollout's max_model_len (a 328-token memory
# turn plus its 32-token answer is 360, rounded up). The direct baseline's prompt must fit it with its answer: 16 new
# tokens and the chat template's 39 tokens (system turn and role markers, added by the server after truncation)
# leave 416 - 16 - 39 = 361 tokens for the middle-truncated prompt; 360 of them. The direct template and question
# take ~75 tokens, so ~285 document tokens (~4.5 chunks) survive: documents of 1-4 chunks are read whole.
WINDOW = 416
DIRECT_MAX_INPUT = 360
CHAT_TEMPLATE_TOKENS = 39


def defaults(batching: bool = True) -> dict[str, Any]:
    """The ``defaults`` of a reader table: the replication's budgets and its server."""
    return {
        "method": "memory-boxed",
        "group": GROUP,
        "serve": "transformers",
        "concurrency": CONCURRENCY if batching else 1,
        "transformers_args": list(BATCHING_ARGS) if batching else [],
        "memory": {
            "chunk_size": CHUNK_SIZE,
            "max_new": MEMORY_TOKENS,
            "final_max_new": FINAL_TOKENS,
            "max_context": None,  # read every chunk (64 chunks at the longest)
        },
        "direct": {"max_input": DIRECT_MAX_INPUT, "max_output": FINAL_TOKENS},
    }


def table(checkpoints: dict[str, str | Path], batching: bool = True) -> dict[str, Any]:
    """A model table (``defaults`` and ``models``) with one entry per ``name -> reader folder``."""
    if not checkpoints:
        raise ValueError("no checkpoints: give at least one NAME=FOLDER")
    models = [{"name": name, "checkpoint": str(Path(folder).resolve())} for name, folder in checkpoints.items()]
    return {"defaults": defaults(batching), "models": models}


def parse_checkpoint(text: str) -> tuple[str, str]:
    name, sep, folder = text.partition("=")
    if not sep or not name or not folder:
        raise argparse.ArgumentTypeError(f"expected NAME=FOLDER, got {text!r}")
    return name, folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.needle.eval_models",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("checkpoints", nargs="+", type=parse_checkpoint, metavar="NAME=FOLDER")
    parser.add_argument("--out", required=True, type=Path, help="the table to write (YAML)")
    parser.add_argument(
        "--no-batching", action="store_true", help="one request at a time (transformers serve's default)"
    )
    args = parser.parse_args(argv)
    checkpoints = dict(args.checkpoints)
    if len(checkpoints) != len(args.checkpoints):
        parser.error("a name is given twice")
    missing = [f"{n}={f}" for n, f in checkpoints.items() if not (Path(f) / "config.json").is_file()]
    if missing:
        parser.error(f"not a model folder (no config.json): {', '.join(missing)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(yaml.safe_dump(table(checkpoints, not args.no_batching), sort_keys=False))
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
