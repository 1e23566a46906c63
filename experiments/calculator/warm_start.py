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
import torch.nn.functional as F

from experiments.calculator.task import problems
from experiments.calculator.teacher import CALL_PROBABILITY, Row, agent_config, build_tokenizer, rows, transcript
from experiments.small_reader import copy_rows, reader_config
from recurrent.agents.calculator import CalculatorConfig
from recurrent.atomic import atomic_path
from recurrent.models import manifest_ok, models_dir, write_manifest

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


def target_logits(model: Any, batch: list[Row], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The logits that predict each target token of the (right-padded) rows, the target ids, and each target
    token's row."""
    sequences = [prompt + target for prompt, target in batch]
    width = max(len(s) for s in sequences)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    row_of, positions, labels = [], [], []
    for i, ((prompt, _), sequence) in enumerate(zip(batch, sequences, strict=True)):
        ids[i, : len(sequence)] = torch.tensor(sequence)
        mask[i, : len(sequence)] = 1
        for j in range(len(prompt), len(sequence)):
            row_of.append(i)
            positions.append(j - 1)
            labels.append(sequence[j])
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    return model.lm_head(hidden[row_of, positions]), torch.tensor(labels), row_of


@torch.no_grad()
def teacher_forced(model: Any, held: dict[str, list[Row]], pad_id: int) -> dict[str, float]:
    """Per kind of held-out row: the share whose every target token is the argmax (greedy reproduces it)."""
    model.eval()
    scores = {}
    for kind, kind_rows in held.items():
        if not kind_rows:
            continue
        logits, labels, row_of = target_logits(model, kind_rows, pad_id)
        exact = [True] * len(kind_rows)
        for row, ok in zip(row_of, (logits.argmax(-1) == labels).tolist(), strict=True):
            exact[row] = exact[row] and ok
        scores[kind] = round(sum(exact) / len(exact), 3)
    model.train()
    return scores


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
    """AdamW (betas 0.9/0.98, no weight decay, clip 1.0, linear warm-up over ``warmup`` steps) on ``steps``
    batches of ``sample(scale.batch)``; the held-out rows are scored every ``scale.eval_every`` steps and after
    the last."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    curve, losses, tokens, train_s, cpu_s = [], [], 0, 0.0, 0.0
    model.train()
    for step in range(1, steps + 1):
        batch = sample(scale.batch)
        t0, c0 = time.perf_counter(), time.process_time()
        logits, labels, _ = target_logits(model, batch, pad_id)
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        train_s += time.perf_counter() - t0
        cpu_s += time.process_time() - c0
        tokens += sum(len(p) + len(t) for p, t in batch)
        losses.append(loss.item())
        if step % scale.eval_every == 0 or step == steps:
            recent = losses[-scale.eval_every :]
            point = {"step": step, "loss": round(sum(recent) / len(recent), 4), **teacher_forced(model, held, pad_id)}
            curve.append(point)
            log(f"{name} step {step}: {point} ({tokens / cpu_s:.0f} tokens per CPU second)")
    return {
        "stage": name,
        "steps": steps,
        "tokens": tokens,
        "train_s": round(train_s, 1),
        "cpu_s": round(cpu_s, 1),
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
    from transformers import AutoModelForCausalLM

    config = config or agent_config()
    start, cpu_start = time.perf_counter(), time.process_time()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # deterministic, and the build's CPU time is its wall time on an idle core
    try:
        torch.manual_seed(seed)
        tokenizer = build_tokenizer(config, seed)
        pad = tokenizer.pad_token_id
        model = AutoModelForCausalLM.from_config(
            reader_config(tokenizer, max_positions=1024), attn_implementation="sdpa"
        )
        model.generation_config.pad_token_id = pad
        model.generation_config.eos_token_id = tokenizer.eos_token_id

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
    finally:
        torch.set_num_threads(threads)
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


def save(folder: Path, model: Any, tokenizer: Any, recipe: dict[str, Any]) -> None:
    """Write the Hugging Face folder: model, tokenizer (chat template included), ``warm_start.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "warm_start.json").write_text(json.dumps(recipe, indent=1) + "\n")


def build(folder: Path, scale: Scale, seed: int = 0, log: Any = print) -> dict[str, Any]:
    """Train, save into ``folder`` (a temporary one when cached), then run the agent greedily on validation
    problems with the saved model; its accuracy is added to ``warm_start.json``. Returns the recipe."""
    from experiments.calculator.evaluate import evaluate

    model, tokenizer, recipe = train(scale, seed, log=log)
    save(folder, model, tokenizer, recipe)
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
    sizes = {k: v for k, v in asdict(scale).items() if k != "name"}
    return {"seed": seed, "agent_sha256": hashlib.sha256(agent.encode()).hexdigest(), **sizes}


def cached_warm_start(root: Path | None = None, quick: bool = False, force: bool = False, log: Any = print) -> Path:
    """The warm start in the model cache (``root``, default :func:`recurrent.models.models_dir`), built unless an
    up-to-date copy is there. Built under a temporary name with the manifest last, then renamed."""
    scale = QUICK if quick else FULL
    dest = (root or models_dir()) / scale.name
    extra = manifest_extra(scale)
    if not force and manifest_ok(dest, scale.name, RECIPE_VERSION, extra):
        log(f"{scale.name}: up to date, reused")
        return dest
    log(f"{scale.name}: building ({'+'.join(map(str, scale.steps))} steps, one thread) into {dest}")
    with atomic_path(dest, folder=True) as tmp:
        recipe = build(tmp, scale, log=log)
        write_manifest(tmp, scale.name, RECIPE_VERSION, extra)
    log(f"{scale.name}: built in {recipe['build_wall_s'] / 60:.1f} min (+ evaluation)")
    return dest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.calculator.warm_start", description=__doc__.split("\n\n")[0]
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--cache", action="store_true", help="build into the model cache unless up to date")
    where.add_argument("--out", type=Path, help="build a variant into this folder")
    parser.add_argument("--quick", action="store_true", help="the short build for tests of the pipeline")
    parser.add_argument("--root", type=Path, help="with --cache: the cache folder (default: the models cache)")
    parser.add_argument("--force", action="store_true", help="with --cache: rebuild even when up to date")
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
