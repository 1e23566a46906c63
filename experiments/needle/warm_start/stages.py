"""The warm start's stage loop: each stage trains to its target or its step budget; the build runs the copy
stages (or reuses them), the choosing task's stages, then the naive teacher's."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import torch

from experiments.needle.needle import number_rule
from experiments.needle.reader import DEFAULT_CORPUS, build_tokenizer, reader_config
from experiments.needle.warm_start.recipes import COPY_STAGES, FULL, RECIPE_VERSION, Scale
from experiments.needle.warm_start.rows import (
    ANSWER_ROWS,
    agent_config,
    answer_rows,
    choice_rows,
    needle_rows,
    paper_rows,
    recall_rows,
)
from experiments.needle.warm_start.teachers import share_of_needles, teacher_rows
from experiments.sft import Point, Row, new_reader, numerics, pin_numerics, sft_steps, teacher_forced, torch_threads
from experiments.small_reader import copy_rows as synth_rows
from recurrent.atomic import atomic_path
from recurrent.impls.memory import MemoryWorkflow


def train_stage(
    model: Any,
    name: str,
    sample: Any,
    held: list[Row],
    pad_id: int,
    lr: float,
    warmup: int,
    steps: int,
    stop_key: str | None,
    stop_at: float = 0.9,
    batch: int = 32,
    eval_every: int = 25,
    log: Any = print,
) -> dict[str, Any]:
    """:func:`experiments.sft.sft_steps` on ``sample(batch)`` for at most ``steps`` steps. The held-out rows are
    scored every ``eval_every`` steps and after the last one; the stage stops at the first score whose ``stop_key``
    reaches ``stop_at`` (no target: ``stop_key`` None)."""
    curve: list[dict[str, Any]] = []
    stopped = "budget"

    def point(at: Point) -> bool:
        nonlocal stopped
        res = teacher_forced(model, held, pad_id)
        rec = {"stage": name, "step": at.step, "train_min": round(at.train_s / 60, 2), "tokens": at.tokens}
        rec |= {"train_loss": round(at.loss, 3), **res}
        curve.append(rec)
        log(
            f"{name:<6} step {at.step:>4}/{steps:<4} {rec['train_min']:6.2f} min  train loss {rec['train_loss']:.3f}"
            f"  held-out: tok_acc {res['tok_acc']:.3f} exact {res['exact']:.3f} loss {res['loss']:.3f}"
        )
        if stop_key is not None and res[stop_key] >= stop_at:
            stopped = "target"
        return stopped == "target"

    last = sft_steps(model, sample, pad_id, lr, warmup, steps, batch, eval_every, point)
    return {
        "stage": name,
        "budget": steps,
        "steps": curve[-1]["step"],
        "stopped": stopped,
        "train_s": round(last.train_s, 1),
        "tokens": last.tokens,
        "tok_per_s": round(last.tokens / max(last.train_s, 1e-9)),
        "lr": lr,
        "final": curve[-1],
        "curve": curve,
    }


class Build:
    """One build in progress: the reader (torch's seed set first, so its initial weights are the seed's), its
    tokenizer and agent, the random streams of the training draws and of the held-out rows, and the stages' budgets
    and logs."""

    def __init__(self, scale: Scale, seed: int, stop_at: float, task: str, corpus: str, log: Any) -> None:
        torch.manual_seed(seed)
        self.scale, self.seed, self.stop_at, self.log = scale, seed, stop_at, log
        self.tokenizer = build_tokenizer(corpus=corpus)
        self.model = new_reader(self.tokenizer, reader_config(self.tokenizer))
        self.workflow = MemoryWorkflow(agent_config(), self.tokenizer)
        self.rng, self.held_rng = random.Random(f"train-{seed}"), random.Random(f"held-{seed}")
        between = {"recall": getattr(scale, "recall", 0), "choice": getattr(scale, "choice", 0)}
        self.budgets = dict(zip(("synth", "needle", "paper", "naive"), scale.steps, strict=True))
        self.budgets |= (between if task == "choose" else {}) | {"answer": scale.answer}
        self.count = 4 + (sum(map(bool, between.values())) if task == "choose" else 0) + bool(scale.answer)
        self.logs: list[dict[str, Any]] = []
        self._since = time.perf_counter()

    def stage(
        self, name: str, sample: Any, held: list[Row], lr: float, warmup: int, stop_key: str | None, every: int = 25
    ) -> None:
        """Train stage ``name`` (:func:`train_stage`) on ``sample``, scored on ``held``, and log it with its wall time
        since the last stage ended (making its data included)."""
        scale = self.scale
        budget, stop = self.budgets[name], scale.recall_stop if name == "recall" else self.stop_at
        target = f"stop at {stop_key} >= {stop}" if stop_key else "no target"
        self.log(
            f"stage {len(self.logs) + 1}/{self.count} {name}: at most {budget} steps of batch {scale.batch}, {target}"
        )
        pad = self.tokenizer.pad_token_id
        kw = {"batch": scale.batch, "eval_every": every, "log": self.log}
        rec = train_stage(self.model, name, sample, held, pad, lr, warmup, budget, stop_key, stop, **kw)
        now = time.perf_counter()
        self.logs.append(rec | {"wall_s": round(now - self._since, 1)})
        self._since = now


def copy_stages(build: Build) -> None:
    """Stages 1-3, the copy curriculum: synthetic copies, then the needle from a bare chunk, then from the paper's
    memory prompt (the package's docstring)."""
    tokenizer, rng, held_rng, scale = build.tokenizer, build.rng, build.held_rng, build.scale
    synth_held = synth_rows(tokenizer, held_rng, scale.held[0])
    build.stage("synth", lambda n: synth_rows(tokenizer, rng, n), synth_held, 3e-3, 100, "tok_acc")
    needle_pool, needle_held = (
        needle_rows(tokenizer, rng, scale.pools[0]),
        needle_rows(tokenizer, held_rng, scale.held[1]),
    )
    build.stage("needle", lambda n: rng.sample(needle_pool, n), needle_held, 3e-3, 100, "exact")
    paper_pool = paper_rows(build.workflow, rng, scale.pools[1])
    paper_held = paper_rows(build.workflow, held_rng, scale.held[2])
    build.stage("paper", lambda n: rng.sample(paper_pool, n), paper_held, 1e-3, 20, "exact")


def copy_key(build: Build, corpus: str) -> dict[str, Any]:
    """What decides the copy stages' outcome: a kept copy is reused only by a build with the same key."""
    scale = build.scale
    key = {"version": RECIPE_VERSION, "seed": build.seed, "stop_at": build.stop_at, "steps": list(scale.steps[:3])}
    key |= {"corpus": corpus, "numbers": number_rule()} if (corpus, number_rule()) != (DEFAULT_CORPUS, "dealt") else {}
    return key | {"pools": list(scale.pools[:2]), "held": list(scale.held[:3]), "batch": scale.batch}


def reuse_copy_stages(build: Build, copy_dir: Path, key: dict[str, Any]) -> bool:
    """Load the copy stages kept in ``copy_dir`` (weights, logs, the random streams' states) when their key is
    ``key``; whether they were."""
    from transformers import AutoModelForCausalLM

    saved = copy_dir / COPY_STAGES
    if not saved.is_file() or json.loads(saved.read_text())["key"] != key:
        return False
    state = json.loads(saved.read_text())
    build.model.load_state_dict(AutoModelForCausalLM.from_pretrained(copy_dir).state_dict())
    build.logs += [stage_log | {"reused_from": str(copy_dir)} for stage_log in state["stages"]]
    for stream, (version, internal, gauss) in ((build.rng, state["rng"]), (build.held_rng, state["held_rng"])):
        stream.setstate((version, tuple(internal), gauss))
    build.log(f"stages 1-3: the copy stages of {copy_dir}, reused")
    return True


def keep_copy_stages(build: Build, copy_dir: Path, key: dict[str, Any]) -> None:
    """Keep the model after the copy stages in ``copy_dir``, with their key, logs and the random streams' states."""
    with atomic_path(copy_dir, folder=True) as tmp:
        build.model.save_pretrained(tmp)
        state = {"key": key, "stages": build.logs, "rng": build.rng.getstate(), "held_rng": build.held_rng.getstate()}
        (tmp / COPY_STAGES).write_text(json.dumps(state) + "\n")


def answer_stage(build: Build) -> None:
    """The answer stage, where the build's scale has one (the needle task's recipe 6 on): the final prompt with the
    needle in memory -> its boxed number (:func:`answer_rows`), to exact ``stop_at``."""
    if build.budgets["answer"]:
        pool = answer_rows(build.workflow, build.rng, ANSWER_ROWS[0])
        held = answer_rows(build.workflow, build.held_rng, ANSWER_ROWS[1])
        build.stage("answer", lambda n: build.rng.sample(pool, n), held, 1e-3, 20, "exact")


def replaying(
    rng: random.Random, pool: list[Row], replay: Callable[[int], list[Row]] | None, share: float
) -> Callable[[int], list[Row]]:
    """A stage's draw of ``n`` rows: ``round(n * share)`` drawn by ``replay``, an earlier stage's draw (so that its
    skill is not trained away), the rest from ``pool``; share 0 draws from ``pool`` alone, as a stage without
    replay does."""

    def sample(n: int) -> list[Row]:
        k = round(n * share)
        return (replay(k) if k else []) + rng.sample(pool, n - k)

    return sample


def choose_stages(build: Build) -> Callable[[int], list[Row]] | None:
    """The choosing task's stages between the copy stages and the naive one, those its recipe has: recall, choice.
    Returns the choice stage's draw of training rows (None without a choice stage), which the naive stage may
    replay: from its pool, or fresh rows every step (``choice_fresh``)."""
    tokenizer, rng, held_rng, scale = build.tokenizer, build.rng, build.held_rng, build.scale
    if build.budgets.get("recall"):
        recall_held = recall_rows(tokenizer, held_rng, scale.recall_held)[0]
        recall_sample = lambda n: recall_rows(tokenizer, rng, n)[0]  # noqa: E731  (fresh documents every step)
        build.stage("recall", recall_sample, recall_held, 1e-3, 50, "exact", every=250)
    if build.budgets.get("choice"):
        pool, held = scale.choice_rows
        if scale.choice_fresh:  # new documents every step: nothing to memorise, only the copy to learn
            choice_sample = partial(choice_rows, build.workflow, rng)
        else:
            choice_pool = choice_rows(build.workflow, rng, pool)
            choice_sample = partial(rng.sample, choice_pool)
        choice_held = choice_rows(build.workflow, held_rng, held, True)
        build.stage("choice", choice_sample, choice_held, 1e-3, 20, "exact")
        return choice_sample
    return None


def train(
    scale: Scale = FULL,
    p_needle: float | None = None,
    p_keep: float = 0.9,
    seed: int = 0,
    threads: int = 1,
    log: Any = print,
    stop_at: float = 0.9,
    copy_dir: Path | None = None,
    task: str = "needle",
    corpus: str = DEFAULT_CORPUS,
    miss: str = "first",
) -> tuple[Any, Any, dict[str, Any]]:
    """Train the warm start; returns the model, its tokenizer and the recipe with the stage logs. ``stop_at``: the
    held-out score at which the three copy stages stop (a higher one copies more exactly, in more steps).
    ``copy_dir``: where the model after the three copy stages is kept (with their logs and the random streams'
    states), reused by a later build of the same copy stages (seed, ``stop_at``, their budgets, pools, batch), so
    that teacher variants train only the naive stage; the result is the build without it, weight for weight.
    ``task``: the naive stage's documents and teacher (needle: :func:`needle_write`; choose: choosing documents,
    :func:`teacher_document`, and :func:`choice_write`); the three copy stages are the same for both. ``corpus``:
    the tokenizer's (:data:`experiments.needle.reader.CORPORA`); ``miss``: what the needle task's teacher writes
    when it does not write the needle (:func:`needle_write`); ``p_needle``: the task's
    :data:`~experiments.needle.warm_start.teachers.P_NEEDLE` unless given. The answer stage's budget is the scale's
    (:attr:`Scale.answer`, :func:`answer_stage`)."""
    p_needle = share_of_needles(task, p_needle)
    replay = getattr(scale, "naive_replay", 0.0)
    if replay and not (task == "choose" and getattr(scale, "choice", 0)):
        raise ValueError(f"naive_replay {replay}: the naive stage replays the choice stage's rows; this build has none")
    t_build = time.perf_counter()
    pin_numerics()  # before the first kernel of this build's process (the same weights on one machine)
    with torch_threads(threads):
        build = Build(scale, seed, stop_at, task, corpus, log)
        key = copy_key(build, corpus)
        if not (copy_dir and reuse_copy_stages(build, copy_dir, key)):
            copy_stages(build)
            if copy_dir:
                keep_copy_stages(build, copy_dir, key)
        answer_stage(build)
        choice_sample = choose_stages(build)
        form = getattr(scale, "form", "sentence")
        teacher = partial(
            teacher_rows, build.workflow, p_needle=p_needle, p_keep=p_keep, task=task, form=form, miss=miss
        )
        naive_pool, naive_held = teacher(build.rng, scale.pools[2]), teacher(build.held_rng, scale.held[3])
        naive_sample = replaying(build.rng, naive_pool, choice_sample, replay)
        build.stage("naive", naive_sample, naive_held, 1e-3, 20, None, every=50)
        ran_with = numerics()  # inside the block: the threads the stages ran on, not the process's default
    model, tokenizer = build.model, build.tokenizer
    recipe = {
        "reader": {"params": sum(p.numel() for p in model.parameters()), "vocab": len(tokenizer)},
        "task": task,
        "tokenizer_corpus": corpus,
        "numbers": number_rule(),
        "teacher": {"p_needle": p_needle, "p_keep": p_keep, "miss": miss},
        "seed": seed,
        "stop_at": stop_at,
        "threads": threads,
        "numerics": ran_with,
        "scale": asdict(scale),
        "stages": build.logs,
        "build_wall_s": round(time.perf_counter() - t_build, 1),
    }
    return model, tokenizer, recipe
