"""The supervised warm start of the CPU experiments' small readers (experiments/needle, experiments/calculator):
plain-torch SFT with the loss on target tokens only, teacher-forced scoring of held-out rows, the stage loop, one
torch thread, and the build of a warm start into the offline model cache of :mod:`recurrent.models`.

What each experiment trains on and how it reports its stages stays in its own ``warm_start``; this module is
the machinery they share, so the two builds train the same way (docs/replication_cpu.md, docs/calculator_cpu.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from experiments.small_reader import Row
from recurrent.atomic import atomic_path
from recurrent.models import manifest_ok, models_dir, write_manifest

__all__ = [
    "Point",
    "Row",
    "add_cache_arguments",
    "batch_loss",
    "cached_build",
    "new_reader",
    "numerics",
    "pin_numerics",
    "save",
    "scale_sizes",
    "sft_steps",
    "teacher_forced",
    "torch_threads",
]


def new_reader(tokenizer: Any, config: Any) -> Any:
    """A randomly initialised causal LM of ``config`` (torch's global seed) that generates with the tokenizer's
    pad and eos ids."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def batch_loss(model: Any, rows: list[Row], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Mean cross-entropy over the target tokens of ``rows`` (right-padded); also the logits that predict each
    target token, the target ids, and each target token's row."""
    sequences = [prompt + target for prompt, target in rows]
    width = max(len(s) for s in sequences)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    row_of, positions, labels = [], [], []
    for i, ((prompt, _), sequence) in enumerate(zip(rows, sequences, strict=True)):
        ids[i, : len(sequence)] = torch.tensor(sequence)
        mask[i, : len(sequence)] = 1
        for j in range(len(prompt), len(sequence)):
            row_of.append(i)
            positions.append(j - 1)
            labels.append(sequence[j])
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    logits = model.lm_head(hidden[row_of, positions])
    targets = torch.tensor(labels)
    return F.cross_entropy(logits, targets), logits, targets, row_of


@torch.no_grad()
def teacher_forced(model: Any, rows: list[Row], pad_id: int, batch: int = 64) -> dict[str, float]:
    """Held-out rows scored teacher-forced, ``batch`` rows a forward pass: per-token argmax accuracy, the share of
    exact rows (every target token is the argmax: greedy reproduces it) and the mean loss per target token."""
    model.eval()
    hit = total = exact = 0
    loss_sum = 0.0
    for start in range(0, len(rows), batch):
        part = rows[start : start + batch]
        loss, logits, labels, row_of = batch_loss(model, part, pad_id)
        ok = (logits.argmax(-1) == labels).tolist()
        hit, total, loss_sum = hit + sum(ok), total + len(ok), loss_sum + loss.item() * len(ok)
        whole = [True] * len(part)
        for row, token_ok in zip(row_of, ok, strict=True):
            whole[row] = whole[row] and token_ok
        exact += sum(whole)
    model.train()
    return {"tok_acc": round(hit / total, 3), "exact": round(exact / len(rows), 3), "loss": round(loss_sum / total, 3)}


@dataclass(frozen=True)
class Point:
    """Where a stage stands at one of its evaluation steps: the mean training loss since the last one, and the
    stage's totals so far (rows' tokens, seconds in the training steps, CPU seconds of this process there)."""

    step: int
    loss: float
    tokens: int
    train_s: float
    cpu_s: float


def sft_steps(
    model: Any,
    sample: Callable[[int], list[Row]],
    pad_id: int,
    lr: float,
    warmup: int,
    steps: int,
    batch: int,
    eval_every: int,
    checkpoint: Callable[[Point], bool],
) -> Point:
    """AdamW (betas 0.9/0.98, no weight decay, clip 1.0, linear warm-up over ``warmup`` steps) on ``sample(batch)``
    for at most ``steps`` steps. ``checkpoint`` is called every ``eval_every`` steps and after the last one; the
    stage stops when it returns True. Counting steps, not time, makes the weights the same on a slow machine as on a
    fast one. Returns the last point (a stage of 0 steps: step 0)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    losses: list[float] = []
    point = Point(0, float("nan"), 0, 0.0, 0.0)
    tokens, train_s, cpu_s = 0, 0.0, 0.0
    model.train()
    for step in range(1, steps + 1):
        rows = sample(batch)
        t0, c0 = time.perf_counter(), time.process_time()
        loss, *_ = batch_loss(model, rows, pad_id)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        train_s += time.perf_counter() - t0
        cpu_s += time.process_time() - c0
        tokens += sum(len(p) + len(t) for p, t in rows)
        losses.append(loss.item())
        if step % eval_every == 0 or step == steps:
            recent = losses[-eval_every:]
            point = Point(step, sum(recent) / len(recent), tokens, train_s, cpu_s)
            if checkpoint(point):
                break
    return point


# The kernels' vector width decides the rounding of every sum, so a build's weights differ between a machine with
# AVX-512 and one with AVX2 only (docs/replication_cpu_notebook.md, "One build, one result"). These pin torch's own
# kernels and MKL's to their AVX2 paths, which every x86-64 machine of the last decade has; on an AVX2 machine they
# change nothing. They are not enough across machines: a build on an Intel machine with AVX-512 still differed from
# the committed run's ("The build on another machine"), so the record names the processor too.
PINNED_NUMERICS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}


def pin_numerics() -> dict[str, str]:
    """Set :data:`PINNED_NUMERICS` in this process's environment unless it names its own; returns what is set. torch
    and MKL read them when they first run a kernel, so this takes effect in a process that has not run one yet (a
    build's command); :func:`numerics` tells what a build ran with."""
    for name, value in PINNED_NUMERICS.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in PINNED_NUMERICS}


def numerics() -> dict[str, Any]:
    """What a build's arithmetic ran with: torch's version and kernel path, MKL's branch, the threads."""
    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
        "threads": torch.get_num_threads(),
        "processor": processor(),
    }


def processor() -> str:
    """The processor's model name (``/proc/cpuinfo``'s first ``model name``; elsewhere what :mod:`platform` says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block on ``count`` torch threads (a build is deterministic on one, and its CPU time is its wall
    time on an idle core)."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def save(folder: Path, model: Any, tokenizer: Any, recipe: dict[str, Any]) -> None:
    """Write the Hugging Face folder: model, tokenizer (chat template included), ``warm_start.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "warm_start.json").write_text(json.dumps(recipe, indent=1) + "\n")


def scale_sizes(scale: Any) -> dict[str, Any]:
    """A build's sizes (a dataclass with a ``name``) as the cache manifest records them: everything but the name."""
    return {k: v for k, v in asdict(scale).items() if k != "name"}


def cached_build(
    root: Path | None,
    name: str,
    version: int,
    extra: dict[str, Any],
    build: Callable[[Path], dict[str, Any] | None],
    force: bool = False,
    what: str = "",
    log: Callable[[str], Any] = print,
) -> Path:
    """The build ``name`` in the model cache (``root``, default :func:`recurrent.models.models_dir`), made by
    ``build(folder)`` unless an up-to-date copy is there (the manifest of :mod:`recurrent.models` with ``version``
    and ``extra``). Built under a temporary name with the manifest last, then renamed, so a killed build leaves no
    folder that looks complete. ``what`` describes the build in the log line that announces it. What ``build``
    returns (how it came out: its stages' stop steps and scores) goes into the manifest as ``built``, a record that
    the up-to-date check does not compare."""
    dest = (root or models_dir()) / name
    if not force and manifest_ok(dest, name, version, extra):
        log(f"{name}: up to date, reused")
        return dest
    log(f"{name}: building ({what}) into {dest}")
    with atomic_path(dest, folder=True) as tmp:
        outcome = build(tmp)
        write_manifest(tmp, name, version, extra | ({"built": outcome} if outcome else {}))
    return dest


def add_cache_arguments(parser: argparse.ArgumentParser, quick: str, exclusive: bool = False) -> None:
    """The options of a warm start's command that build it into the model cache (``quick``: what ``--quick``
    builds); ``exclusive``: ``--cache`` and ``--out`` are one required choice."""
    if exclusive:
        where = parser.add_mutually_exclusive_group(required=True)
        where.add_argument("--cache", action="store_true", help="build into the model cache unless up to date")
        where.add_argument("--out", type=Path, help="build a variant into this folder")
    else:
        parser.add_argument("--cache", action="store_true", help="build into the model cache unless up to date")
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument(
        "--root", type=Path, help="with --cache: the cache folder (default: MEMAGENT_MODELS_DIR, else the models cache)"
    )
    parser.add_argument("--force", action="store_true", help="with --cache: rebuild even when up to date")
