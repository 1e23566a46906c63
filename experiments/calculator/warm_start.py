"""The calculator's warm start: a tiny Qwen2 reader trained by plain-torch SFT on teacher transcripts.

    python -m experiments.calculator.warm_start --cache [--quick] [--force]   # into the model cache; prints the folder
    python -m experiments.calculator.warm_start --out DIR [--steps N] [--seed 0]   # a variant, then its evaluation

The transcripts are the real agent's calls driven by the scripted teacher of :mod:`experiments.calculator.teacher`
(it knows the tool format, calls the tool on ``*`` problems and mostly guesses on ``+`` and ``-``), so the student
learns the format and copying (the expression from the question, the result from the tool response) but not
when the tool pays: its greedy accuracy on held-out problems is about a third, and RL has room to raise it.

The reader: the teacher's byte-level BPE (vocabulary :data:`~experiments.calculator.teacher.VOCAB_SIZE`, one token
per digit, the Qwen-style chat template of ``recurrent.models``) and a Qwen2 of hidden 128, 4 layers, 8/4 heads,
intermediate 512, tied embeddings (~1M parameters). SFT: AdamW (lr 1e-3, linear warm-up, clip 1.0), the loss on
the reply tokens only, batches of rows drawn from a fixed pool of transcripts, one CPU thread, a step budget (not
a time cap: the weights do not depend on the machine's speed). Held-out transcripts (validation problems) are
scored teacher-forced every ``eval_every`` steps; at the end the agent runs greedily on validation problems
(:func:`experiments.calculator.evaluate.evaluate`) and the result goes into ``warm_start.json``.

:func:`cached_warm_start` keeps the build in the offline model cache of :mod:`recurrent.models`
(``calculator-reader``; ``--quick``: ``calculator-reader-quick``, a short build for tests of the pipeline that
already writes the tool format when sampled) with that module's manifest, written last: a killed build never
looks complete.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from experiments import sft
from experiments.calculator.agent import CalculatorConfig
from experiments.calculator.task import problems
from experiments.calculator.teacher import CALL_PROBABILITY, agent_config, build_tokenizer, rows, transcript
from experiments.sft import Point, Row
from experiments.small_reader import copy_rows, reader_config

# Bump when the build changes (teacher, data, model, optimizer), so a cached warm start built the old way is rebuilt.
RECIPE_VERSION = 1


@dataclass(frozen=True)
class Scale:
    """A build's size: SFT steps, the training and held-out transcript pools (problems), the batch (rows), how
    often the held-out rows are scored, and the validation problems of the final greedy evaluation."""

    name: str
    steps: tuple[int, int, int]  # copy, format, policy
    warmup: tuple[int, int, int] = (100, 50, 50)  # linear learning-rate warm-up steps of each stage
    transcripts: int = 2000
    held: int = 64
    batch: int = 32
    eval_every: int = 50
    eval_problems: int = 64


FULL = Scale("calculator-reader", steps=(400, 300, 300))
# For tests of the pipeline: enough steps that sampling writes tool calls (a trainer test needs calls with tool
# results), far from the full build's accuracy.
QUICK = Scale(
    "calculator-reader-quick",
    steps=(0, 80, 40),
    warmup=(1, 16, 8),
    transcripts=300,
    held=16,
    batch=16,
    eval_every=40,
    eval_problems=0,
)


# ---------------------------------------------------------------------------------------------------------
# SFT
# ---------------------------------------------------------------------------------------------------------


def held_out_exact(model: Any, held: dict[str, list[Row]], pad_id: int) -> dict[str, float]:
    """Per kind of held-out row: the share whose every target token is the argmax (greedy reproduces it), each
    kind's rows in one forward pass."""
    return {kind: sft.teacher_forced(model, rows, pad_id, len(rows))["exact"] for kind, rows in held.items() if rows}


def split_by_kind(calls_rows: list[tuple[list[tuple], list[Row]]]) -> dict[str, list[Row]]:
    """Held-out rows by what the teacher did: ``tool_call`` (first call: the tool), ``guess`` (first call: a
    guess), ``answer`` (the answer after a tool response)."""
    kinds: dict[str, list[Row]] = {"tool_call": [], "guess": [], "answer": []}
    for calls, transcript_rows in calls_rows:
        kinds["tool_call" if len(calls) > 1 else "guess"].append(transcript_rows[0])
        kinds["answer"] += transcript_rows[1:]
    return kinds


def train_stage(
    model: Any,
    name: str,
    sample: Callable[[int], list[Row]],
    held: dict[str, list[Row]],
    pad_id: int,
    steps: int,
    scale: Scale,
    lr: float,
    warmup: int,
    log: Any = print,
) -> dict[str, Any]:
    """:func:`experiments.sft.sft_steps` on ``steps`` batches of ``sample(scale.batch)``; the held-out rows are
    scored every ``scale.eval_every`` steps and after the last."""
    curve = []

    def point(at: Point) -> bool:
        curve.append({"step": at.step, "loss": round(at.loss, 4), **held_out_exact(model, held, pad_id)})
        log(f"{name} step {at.step}: {curve[-1]} ({at.tokens / at.cpu_s:.0f} tokens per CPU second)")
        return False

    last = sft.sft_steps(model, sample, pad_id, lr, warmup, steps, scale.batch, scale.eval_every, point)
    return {
        "stage": name,
        "steps": steps,
        "tokens": last.tokens,
        "train_s": round(last.train_s, 1),
        "cpu_s": round(last.cpu_s, 1),
        "curve": curve,
    }


def train(
    scale: Scale = FULL, seed: int = 0, config: CalculatorConfig | None = None, log: Any = print
) -> tuple[Any, Any, dict[str, Any]]:
    """Train the warm start on one thread; returns the model, its tokenizer and the recipe with the curves.

    Two stages on transcripts of train problems: ``format``, a teacher that always calls the tool (every row
    copies: the expression from the question, the result from the tool response), then ``policy``, the teacher
    of :mod:`experiments.calculator.teacher` (when to call it). Copying is what a small transformer learns slowly
    from scratch; a stage where every reply needs it forms it in fewer steps than the mixed transcripts."""
    config = config or agent_config()
    start, cpu_start = time.perf_counter(), time.process_time()
    with sft.torch_threads(1):
        torch.manual_seed(seed)
        tokenizer = build_tokenizer(config, seed)
        pad = tokenizer.pad_token_id
        model = sft.new_reader(tokenizer, reader_config(tokenizer, max_positions=1024))

        def pool(split: str, count: int, rng: random.Random, **teacher: Any) -> list[tuple[list[tuple], list[Row]]]:
            out = []
            for problem in problems(split, count, seed):
                calls = transcript(problem, config, rng, **teacher)
                out.append((calls, rows(tokenizer, calls)))
            return out

        def flat(transcripts: list[tuple[list[tuple], list[Row]]]) -> list[Row]:
            return [row for _, transcript_rows in transcripts for row in transcript_rows]

        rng = random.Random(f"train-{seed}")
        always = {op: 1.0 for op in CALL_PROBABILITY}
        format_rows = flat(pool("train", scale.transcripts, rng, call_probability=always))
        policy_rows = flat(pool("train", scale.transcripts, rng))
        held = split_by_kind(pool("validation", scale.held, random.Random(f"held-{seed}")))
        data_s = time.perf_counter() - start
        log(
            f"data: {len(format_rows)} + {len(policy_rows)} rows, "
            f"held out { {k: len(v) for k, v in held.items()} }, {data_s:.0f} s"
        )
        copy_held = {"copy": copy_rows(tokenizer, random.Random(f"held-copy-{seed}"), 64)}
        copy, formats, policy = (
            partial(copy_rows, tokenizer, rng),
            partial(rng.sample, format_rows),
            partial(rng.sample, policy_rows),
        )
        stages = [
            train_stage(model, "copy", copy, copy_held, pad, scale.steps[0], scale, 3e-3, scale.warmup[0], log),
            train_stage(model, "format", formats, held, pad, scale.steps[1], scale, 1e-3, scale.warmup[1], log),
            train_stage(model, "policy", policy, held, pad, scale.steps[2], scale, 1e-3, scale.warmup[2], log),
        ]
    recipe = {
        "reader": {"params": sum(p.numel() for p in model.parameters()), "vocab": len(tokenizer)},
        "teacher": {"call_probability": CALL_PROBABILITY, "otherwise": "the answer with its last digit changed"},
        "agent": asdict(config),
        "seed": seed,
        "scale": asdict(scale),
        "stages": stages,
        "data_s": round(data_s, 1),
        "build_wall_s": round(time.perf_counter() - start, 1),
        "build_cpu_s": round(time.process_time() - cpu_start, 1),
    }
    return model, tokenizer, recipe


def build(folder: Path, scale: Scale, seed: int = 0, log: Any = print) -> dict[str, Any]:
    """Train, save into ``folder`` (a temporary one when cached), then run the agent greedily on validation
    problems with the saved model; its accuracy is added to ``warm_start.json``. Returns the recipe."""
    from experiments.calculator.evaluate import evaluate

    model, tokenizer, recipe = train(scale, seed, log=log)
    sft.save(folder, model, tokenizer, recipe)
    if not scale.eval_problems:
        return recipe
    result = evaluate(folder, "validation", scale.eval_problems)
    recipe["validation_greedy"] = {k: v for k, v in result.items() if k not in ("model", "examples")}
    log(f"held-out greedy: {json.dumps(recipe['validation_greedy'])}")
    (folder / "warm_start.json").write_text(json.dumps(recipe, indent=1) + "\n")
    return recipe


def manifest_extra(scale: Scale, seed: int = 0, config: CalculatorConfig | None = None) -> dict[str, Any]:
    """What the cache manifest records besides name and recipe version: what changes the weights (the agent's
    settings, as a hash: its prompts are the training prompts)."""
    agent = json.dumps(asdict(config or agent_config()), sort_keys=True)
    return {"seed": seed, "agent_sha256": hashlib.sha256(agent.encode()).hexdigest(), **sft.scale_sizes(scale)}


def cached_warm_start(root: Path | None = None, quick: bool = False, force: bool = False, log: Any = print) -> Path:
    """The warm start in the model cache (``root``, default :func:`recurrent.models.models_dir`), built unless an
    up-to-date copy is there (:func:`experiments.sft.cached_build`)."""
    scale = QUICK if quick else FULL
    built: list[dict[str, Any]] = []

    def build_into(tmp: Path) -> None:
        built.append(build(tmp, scale, log=log))

    what = f"{'+'.join(map(str, scale.steps))} steps, one thread"
    dest = sft.cached_build(root, scale.name, RECIPE_VERSION, manifest_extra(scale), build_into, force, what, log)
    if built:
        log(f"{scale.name}: built in {built[0]['build_wall_s'] / 60:.1f} min (+ evaluation)")
    return dest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.calculator.warm_start", description=__doc__.split("\n\n")[0]
    )
    sft.add_cache_arguments(parser, "the short build for tests of the pipeline", exclusive=True)
    parser.add_argument(
        "--steps", type=int, nargs=3, help="with --out: SFT steps of the copy, format and policy stages"
    )
    parser.add_argument("--seed", type=int, default=0, help="with --out: the seed")
    args = parser.parse_args(argv)
    if args.cache and (args.steps is not None or args.seed != 0):
        parser.error("--cache builds the recipe as it is: --steps and --seed go with --out")
    if args.steps is not None and min(args.steps) < 0:
        parser.error(f"--steps must be at least 0, got {args.steps}")
    log = partial(print, flush=True)
    if args.cache:
        print(cached_warm_start(args.root, quick=args.quick, force=args.force, log=log), flush=True)
        return
    scale = QUICK if args.quick else FULL
    if args.steps is not None:
        scale = replace(scale, steps=tuple(args.steps))
    recipe = build(args.out, scale, args.seed, log=log)
    print(json.dumps({k: v for k, v in recipe.items() if k not in ("curve", "agent")}))


if __name__ == "__main__":
    main()
