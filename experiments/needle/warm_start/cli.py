"""The warm start's command: ``python -m experiments.needle.warm_start`` (usage: the package's docstring)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from experiments.needle.reader import CORPORA, DEFAULT_CORPUS
from experiments.needle.warm_start.cache import build, cached_warm_start
from experiments.needle.warm_start.evaluation import evaluate
from experiments.needle.warm_start.recipes import CHOOSE_RECIPES, FULL, QUICK, TASKS
from experiments.needle.warm_start.rows import CHOOSE_DISTRACTORS
from experiments.needle.warm_start.teachers import MISSES, P_NEEDLE
from experiments.sft import add_cache_arguments

DESCRIPTION = "The warm start of the CPU replication: plain-torch SFT of the ~1M-parameter reader, and its measurement."


def parser() -> argparse.ArgumentParser:
    """The command's options."""
    parser = argparse.ArgumentParser(prog="python -m experiments.needle.warm_start", description=DESCRIPTION)
    add_cache_arguments(parser, "the CI-sized build (seconds; an untrained reader)")
    parser.add_argument("--out", type=Path, help="build the warm start into this folder, then evaluate it")
    parser.add_argument("--evaluate", type=Path, help="evaluate the warm start in this folder")
    parser.add_argument("--steps", type=int, nargs=4, help="with --out: step budgets of the 4 stages")
    parser.add_argument(
        "--task",
        choices=TASKS,
        default="needle",
        help="the naive stage's documents and teacher, and the evaluation's documents (choose: "
        f"{CHOOSE_DISTRACTORS} other needles; the cache: replication-reader-choose)",
    )
    parser.add_argument(
        "--recipe",
        choices=tuple(CHOOSE_RECIPES),
        default="choice",
        help="the choosing task's recipe: choice (a choice stage, whole-sentence memories) or recall (a recall stage, "
        "number memories; the cache: replication-reader-choose-recall)",
    )
    parser.add_argument(
        "--p-needle",
        type=float,
        help="with --out: the naive teacher's share of needle memories (default: the task's, "
        f"{', '.join(f'{task} {p}' for task, p in P_NEEDLE.items())})",
    )
    parser.add_argument("--p-keep", type=float, default=0.9)
    parser.add_argument(
        "--miss",
        choices=MISSES,
        default="first",
        help="with --out: what the needle task's teacher writes when it does not write the needle: the chunk's first "
        "filler sentence, or the memory as it was",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tokenizer-corpus",
        choices=CORPORA,
        default=DEFAULT_CORPUS,
        help="with --out: the reader tokenizer's training text (task: the task's lines and prompts; keys, the "
        "default: also the digit pairs and the keys, repeated)",
    )
    parser.add_argument(
        "--stop-at", type=float, default=0.9, help="with --out: the held-out score that stops the copy stages (0.9)"
    )
    parser.add_argument(
        "--copy-stages",
        type=Path,
        help="with --out: keep the model after the three copy stages in this folder, or reuse it when it holds them",
    )
    parser.add_argument(
        "--answer-steps",
        type=int,
        help="with --out: the budget of the answer stage after the copy stages (the final prompt with the needle in "
        f"memory -> its boxed number, stopped at exact 0.9; the needle recipe's: {FULL.answer}; 0: none)",
    )
    parser.add_argument(
        "--choice-steps",
        type=int,
        help="with --out --task choose: the choice stage's step budget (the recipe's: "
        f"{CHOOSE_RECIPES['choice'][0].choice}; it stops at exact 0.9)",
    )
    parser.add_argument(
        "--choice-fresh",
        action="store_true",
        help="with --out --task choose: the choice stage trains on new documents every step, not on its pool of "
        f"{CHOOSE_RECIPES['choice'][0].choice_rows[0]} rows",
    )
    parser.add_argument(
        "--naive-replay",
        type=float,
        help="with --out --task choose: the share of each naive-stage batch drawn from the choice stage's rows (the "
        f"recipe's: {CHOOSE_RECIPES['choice'][0].naive_replay})",
    )
    parser.add_argument("--docs", type=int, default=32, help="validation documents per length")
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--sample", action="store_true", help="sample (temperature 1) instead of greedy")
    parser.add_argument("--threads", type=int, default=1)
    return parser


def checked(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The options, refused where they do not go together."""
    args = parser.parse_args(argv)
    if sum(map(bool, (args.cache, args.out, args.evaluate))) != 1:
        parser.error("give one of --cache (build into the model cache), --out (build, evaluate), --evaluate")
    if args.answer_steps is not None and args.answer_steps < 0:
        parser.error(f"--answer-steps {args.answer_steps}: a step budget is a whole number >= 0")
    if args.choice_steps is not None and (args.task, args.recipe) != ("choose", "choice"):
        parser.error("--choice-steps is the choice stage's budget: give --task choose (its choice recipe)")
    if args.choice_steps is not None and args.choice_steps < 1:
        parser.error(f"--choice-steps {args.choice_steps}: a step budget is a whole number >= 1")
    if args.choice_fresh and (args.task, args.recipe) != ("choose", "choice"):
        parser.error("--choice-fresh is the choice stage's: give --task choose (its choice recipe)")
    if args.naive_replay is not None and (args.task, args.recipe) != ("choose", "choice"):
        parser.error("--naive-replay replays the choice stage's rows: give --task choose (its choice recipe)")
    if args.naive_replay is not None and not 0 <= args.naive_replay <= 1:
        parser.error(f"--naive-replay {args.naive_replay}: a share of each batch, from 0 to 1")
    if args.recipe != "choice" and args.task != "choose":
        parser.error(f"--recipe {args.recipe} is a recipe of the choosing task: give --task choose")
    if args.cache and (
        args.copy_stages
        or args.steps
        or args.tokenizer_corpus != DEFAULT_CORPUS
        or args.miss != "first"
        or args.p_needle is not None
        or args.answer_steps is not None
        or args.choice_steps is not None
        or args.naive_replay is not None
        or args.choice_fresh
        or (args.p_keep, args.seed, args.threads, args.stop_at) != (0.9, 0, 1, 0.9)
    ):
        parser.error(
            "--cache builds the recipe as it is: --steps, --p-needle, --p-keep, --seed, --threads, --stop-at, "
            "--copy-stages, --tokenizer-corpus, --miss, --answer-steps, --choice-steps, --choice-fresh, "
            "--naive-replay go with --out"
        )
    return args


def main(argv: list[str] | None = None) -> None:
    """Build into the cache, or build into a folder and evaluate it, or evaluate a folder."""
    args = checked(parser(), argv)
    log = partial(print, flush=True)
    if args.cache:
        folder = cached_warm_start(args.root, args.quick, args.force, log=log, task=args.task, recipe=args.recipe)
        print(folder, flush=True)
        return
    torch.set_num_threads(args.threads)
    if args.out:
        scale = CHOOSE_RECIPES[args.recipe][args.quick] if args.task == "choose" else (QUICK if args.quick else FULL)
        if args.steps:
            scale = replace(scale, steps=tuple(args.steps))
        if args.choice_steps is not None:
            scale = replace(scale, choice=args.choice_steps)
        if args.naive_replay is not None:
            scale = replace(scale, naive_replay=args.naive_replay)
        if args.choice_fresh:
            scale = replace(scale, choice_fresh=True)
        if args.answer_steps is not None:
            scale = replace(scale, answer=args.answer_steps)
        recipe = build(
            args.out,
            scale,
            args.p_needle,
            args.p_keep,
            args.seed,
            threads=args.threads,
            log=log,
            stop_at=args.stop_at,
            copy_dir=args.copy_stages,
            task=args.task,
            corpus=args.tokenizer_corpus,
            miss=args.miss,
        )
        print(json.dumps({k: v for k, v in recipe.items() if k != "stages"}))
    folder = args.evaluate or args.out
    distractors = CHOOSE_DISTRACTORS if args.task == "choose" else 0
    result = evaluate(folder, args.docs, tuple(args.chunks), args.sample, distractors=distractors)
    print(json.dumps(result, indent=1), flush=True)
