"""The warm start built into a folder or into the offline model cache of :mod:`recurrent.models`, with the
manifest that says which recipe it is and how it came out."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from experiments.needle.warm_start.recipes import (
    CHOOSE_RECIPE_VERSION,
    CHOOSE_RECIPES,
    FULL,
    QUICK,
    RECIPE_VERSION,
    TASKS,
    Scale,
)
from experiments.needle.warm_start.rows import CHOOSE_DISTRACTORS
from experiments.needle.warm_start.stages import train
from experiments.needle.warm_start.teachers import share_of_needles
from experiments.sft import cached_build, save, scale_sizes
from recurrent.models import models_dir


def build(
    out: Path, scale: Scale = FULL, p_needle: float | None = None, p_keep: float = 0.9, seed: int = 0, **kw: Any
) -> dict:
    """Build the warm start into the folder ``out`` (written in place: see :func:`cached_warm_start` for the
    cache); returns the recipe with the stage logs. ``kw``: ``threads``, ``log``, ``stop_at``, ``copy_dir``,
    ``task`` of :func:`train`."""
    model, tokenizer, recipe = train(scale, p_needle, p_keep, seed, **kw)
    save(out, model, tokenizer, recipe)
    return recipe


def manifest_extra(
    scale: Scale, seed: int = 0, p_needle: float | None = None, p_keep: float = 0.9, task: str = "needle"
) -> dict[str, Any]:
    """What the cache manifest records besides name and recipe version: what changes the weights (the choosing
    task's: also its task, the copy stages' recipe version and the most distractors of its naive stage)."""
    p_needle = share_of_needles(task, p_needle)
    extra = {"seed": seed, "p_needle": p_needle, "p_keep": p_keep, **scale_sizes(scale)}
    if task == "choose":
        extra |= {"task": task, "copy_recipe": RECIPE_VERSION, "distractors": CHOOSE_DISTRACTORS}
    return extra


def build_outcome(recipe: dict[str, Any]) -> dict[str, Any]:
    """How a build came out, for its manifest: each stage's stop step, why it stopped and its last held-out scores,
    and the numerics it ran with (two builds of one recipe that agree here agree weight for weight, as far as a
    record can tell)."""
    scores = ("tok_acc", "exact", "loss")
    stages = [
        {"stage": s["stage"], "steps": s["steps"], "stopped": s["stopped"], **{k: s["final"][k] for k in scores}}
        for s in recipe["stages"]
    ]
    return {"stages": stages, "numerics": recipe["numerics"]}


def copy_stages_dir(root: Path | None, scale: Scale) -> Path:
    """Where the choosing task's cached build keeps its three copy stages (:func:`train`'s ``copy_dir``): beside
    the builds, ``<root>/replication-reader-copy-stages`` (quick: ``replication-reader-quick-copy-stages``)."""
    base = scale.name.replace("-choose", "").replace("-recall", "")
    return (root or models_dir()) / f"{base}-copy-stages"


def cached_warm_start(
    root: Path | None = None,
    quick: bool = False,
    force: bool = False,
    scale: Scale | None = None,
    log: Any = print,
    task: str = "needle",
    recipe: str = "choice",
) -> Path:
    """The warm start in the model cache (``root``, default :func:`recurrent.models.models_dir`), built unless an
    up-to-date copy is there: ``<root>/replication-reader`` (``quick``: ``replication-reader-quick``; ``scale``:
    another size, ``scale.name``; ``task`` choose: ``replication-reader-choose``, ``-choose-quick``, its copy stages
    kept in :func:`copy_stages_dir` and reused). The build trains in memory, then writes the folder under a
    temporary name with the manifest last and renames it, so a killed build leaves no folder that looks complete."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; one of {TASKS}")
    choose = task == "choose"
    if recipe not in CHOOSE_RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; one of {tuple(CHOOSE_RECIPES)}")
    scale = scale or (CHOOSE_RECIPES[recipe][quick] if choose else (QUICK if quick else FULL))
    copy_dir = copy_stages_dir(root, scale) if choose else None
    t0 = time.perf_counter()

    def build_into(tmp: Path) -> dict[str, Any]:
        model, tokenizer, recipe = train(scale, log=log, copy_dir=copy_dir, task=task)
        save(tmp, model, tokenizer, recipe)
        log(f"{scale.name}: built in {(time.perf_counter() - t0) / 60:.1f} min")
        return build_outcome(recipe)

    between = [f"{name} {getattr(scale, name)}" for name in ("answer", "recall", "choice") if getattr(scale, name, 0)]
    what = f"steps at most {'/'.join(map(str, scale.steps))}{''.join(', ' + b for b in between)}, one thread"
    version = CHOOSE_RECIPE_VERSION if choose else RECIPE_VERSION
    extra = manifest_extra(scale, task=task)
    return cached_build(root, scale.name, version, extra, build_into, force, what, log)
