"""The choosing task's ceiling without RL: can a reader learn to pick the asked needle at all, when told the answer?

    python -m experiments.needle.recall_probe --out curve.jsonl [--steps 2000] [--target number|sentence]
        [--prompt bare|paper] [--distractors 3] [--start DIR | --fresh --hidden 256 --layers 4 --synth-steps 1500]
        [--save DIR]

Supervised fine-tuning with an *oracle* target, the asked needle's number (or its whole sentence), on 1-chunk
choosing documents of 2-4 needles (:func:`experiments.needle.needle.make_choice_document`), scored teacher-forced
on held-out documents of the validation split (new keys, new numbers) every ``--eval-every`` steps. This is the
choice RL has to find from a reward, given to the reader as a label: if SFT with the label cannot teach it, 30 RL
steps from a key-blind warm start will not (docs/replication_cpu_notebook.md, "The choosing task", "The ceiling").

Chance is a reader that copies one needle of the document at random, exactly: the mean of 1 / needles over the
held-out documents (0.361 for 1-3 distractors in turn), printed with the curve.

Prompts: ``bare`` is the document, the question and ``"\\nanswer:"`` (short rows, fast steps); ``paper`` is the
memory agent's first prompt (the paper's memory prompt with an empty memory), what the warm start and RL see.
The start: by default the cached copy stages of the warm start (``replication-reader-copy-stages``: synthetic copy,
needle, paper; build them with ``python -m experiments.needle.warm_start --cache --task choose``); ``--fresh``: a
new reader of ``--hidden`` / ``--layers`` trained on the synthetic copy rows first (``--synth-steps``, stopped at
per-token 0.9), to measure whether a larger reader learns the choice.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from experiments.needle.reader import build_tokenizer
from experiments.needle.warm_start import CHOOSE, CHOOSE_DISTRACTORS, copy_stages_dir, recall_rows, train_stage
from experiments.sft import new_reader, sft_steps, teacher_forced, torch_threads
from experiments.small_reader import copy_rows, reader_config

TARGETS = ("number", "sentence")  # recall_rows' targets
PROMPTS = ("bare", "paper")


def chance(needles: list[int]) -> float:
    """The exact score of a reader that copies one of a document's needles at random."""
    return sum(1 / n for n in needles) / len(needles)


def fresh_reader(tokenizer: Any, hidden: int, layers: int, synth_steps: int, log: Any = print) -> Any:
    """A new reader of this size, taught to copy on the synthetic copy rows (lr 3e-3, 100 warm-up steps, as the warm
    start's first stage), stopped at per-token 0.9 or after ``synth_steps``."""
    model = new_reader(tokenizer, reader_config(tokenizer, hidden=hidden, layers=layers))
    rng, held = random.Random("probe-synth"), copy_rows(tokenizer, random.Random("probe-synth-held"), 256)
    log(f"fresh reader: {sum(p.numel() for p in model.parameters()):,} parameters, hidden {hidden}, {layers} layers")

    sample = lambda n: copy_rows(tokenizer, rng, n)  # noqa: E731
    train_stage(
        model,
        "synth",
        sample,
        held,
        tokenizer.pad_token_id,
        3e-3,
        100,
        synth_steps,
        "tok_acc",
        0.9,
        eval_every=250,
        log=log,
    )  # the warm start's own stage loop
    return model


def probe(
    model: Any,
    tokenizer: Any,
    steps: int,
    out: Path,
    target: str = "number",
    prompt: str = "bare",
    lr: float = 1e-3,
    eval_every: int = 250,
    held_docs: int = 300,
    distractors: int = CHOOSE_DISTRACTORS,
    log: Any = print,
) -> list[dict[str, Any]]:
    """Train ``model`` on oracle rows of the train split for ``steps`` steps (batch 32, 50 warm-up steps); score
    the held-out validation rows at step 0 and every ``eval_every`` steps, each point a line of ``out`` (JSON)."""
    rows = partial(recall_rows, tokenizer, target=target, prompt=prompt, distractors=distractors)
    held, needles = rows(random.Random("probe-held"), held_docs, "validation")
    rng, pad, t0 = random.Random("probe-train"), tokenizer.pad_token_id, time.perf_counter()
    base = {
        "target": target,
        "prompt": prompt,
        "distractors": distractors,
        "chance": round(chance(needles), 3),
        "held_docs": held_docs,
    }
    curve: list[dict[str, Any]] = []
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("")

    def record(step: int, loss: float | None) -> bool:
        res = teacher_forced(model, held, pad)
        rec = base | {"step": step, "train_loss": loss, **res, "wall_min": round((time.perf_counter() - t0) / 60, 2)}
        curve.append(rec)
        with out.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        log(f"step {step:>5}/{steps}: held-out exact {res['exact']:.3f} (chance {base['chance']:.3f})")
        return res["exact"] >= 0.95

    record(0, None)
    sample = lambda n: rows(rng, n, "train")[0]  # noqa: E731
    sft_steps(model, sample, pad, lr, 50, steps, 32, eval_every, lambda at: record(at.step, round(at.loss, 3)))
    return curve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.needle.recall_probe", description=__doc__.split("\n\n")[1]
    )
    parser.add_argument("--out", type=Path, required=True, help="the curve, one JSON line per evaluation")
    parser.add_argument("--steps", type=int, default=2000, help="SFT steps of batch 32 (2000)")
    parser.add_argument("--target", choices=TARGETS, default="number", help="the asked needle's number or sentence")
    parser.add_argument("--prompt", choices=PROMPTS, default="bare", help="document + question, or the paper's")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--start", type=Path, help="a reader folder to start from (default: the cached copy stages)")
    parser.add_argument("--fresh", action="store_true", help="start from a new reader of --hidden / --layers")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--synth-steps", type=int, default=1500, help="with --fresh: synthetic copy steps at most")
    parser.add_argument("--save", type=Path, help="save the trained reader (and its tokenizer) into this folder")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--distractors", type=int, default=CHOOSE_DISTRACTORS, help="documents hold 1 to this many other needles"
    )
    args = parser.parse_args(argv)
    if args.distractors < 1:
        parser.error(f"--distractors {args.distractors}: a choice needs at least one other needle")
    if args.fresh and args.start:
        parser.error("--fresh and --start exclude each other")
    log = lambda text: print(text, flush=True)  # noqa: E731
    tokenizer = build_tokenizer()
    with torch_threads(args.threads):
        torch.manual_seed(0)
        if args.fresh:
            model = fresh_reader(tokenizer, args.hidden, args.layers, args.synth_steps, log)
        else:
            from transformers import AutoModelForCausalLM

            start = args.start or copy_stages_dir(None, CHOOSE)
            if not (start / "config.json").is_file():
                parser.error(
                    f"{start}: no reader there; build it: python -m experiments.needle.warm_start --cache --task choose"
                )
            model = AutoModelForCausalLM.from_pretrained(start)
        probe(
            model,
            tokenizer,
            args.steps,
            args.out,
            args.target,
            args.prompt,
            args.lr,
            args.eval_every,
            distractors=args.distractors,
            log=log,
        )
    if args.save:
        model.save_pretrained(args.save)
        tokenizer.save_pretrained(args.save)


if __name__ == "__main__":
    main()
