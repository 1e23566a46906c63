"""The warm start of the CPU replication: plain-torch SFT of the ~1M-parameter reader, and its measurement.

    python -m taskutils.replication.warm_start --out DIR [--p-needle 0.4] [--p-keep 0.9] [--seed 0]
    python -m taskutils.replication.warm_start --evaluate DIR [--docs 32] [--chunks 1 2 4] [--sample]

Build (AdamW, loss on target tokens only, one CPU thread), four stages, each stopped at its target or its cap:

1. ``synth``: 64 random tokens holding ``{ x1..xk }`` and ending with ``{ x1..xk }`` again, k = 24-30, so half
   the row is supervised copy (lr 3e-3, 100 warm-up steps, batch 32; stop at per-token accuracy 0.9). A dense
   copy signal forms copying in ~250 steps; spans of 4-12 tokens stall (docs/replication_probes.md).
2. ``needle``: a 1-chunk train document + "\\nmemory:" -> " " + needle sentence (stop at 0.9 exact).
3. ``paper``: the paper's memory prompt of a 1-chunk train document, built by
   :class:`recurrent.impls.memory.MemoryWorkflow` -> needle sentence (lr 1e-3, 20 warm-up; stop at 0.9 exact).
4. ``naive``: every turn of naive-teacher transcripts of train documents of 1-4 chunks (time cap only).

The naive teacher (:func:`teacher_transcript`) knows the format, not a good reading policy: on a chunk holding
the needle it writes the needle sentence with probability ``p_needle``, else the chunk's first complete
filler sentence; on a chunk without it, it keeps a needle already in memory with probability ``p_keep``, else
writes the chunk's first complete sentence. Final turn: ``\\boxed{number in memory}``, or a random 4-digit
guess. Its filler choice is positional (the first sentence), not random: a student of a teacher that writes the
needle with p = 0.5 and otherwise one of ~5 sentences at random decodes the needle greedily (the needle is the
mode), so greedy accuracy would far exceed the teacher's. Transcripts are sessions of the real workflow
(``chunk_size`` 64, ``max_memorization_length`` 32) fed the teacher's replies, so the training prompts are the
evaluation prompts token for token.

Saves a Hugging Face Qwen2 folder (model, tokenizer with chat template, generation config) with
``warm_start.json`` (recipe, stage logs). Evaluation drives :class:`~recurrent.impls.memory.MemoryWorkflow`
sessions with :func:`recurrent.lockstep.run_lockstep` and a Hugging Face ``generate`` callable over validation
documents, and scores the final answers with ``taskutils.verifiers.strict``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from recurrent.impls.memory import MemoryConfig, MemoryWorkflow
from recurrent.interface import Reply, Turn
from recurrent.lockstep import run_lockstep
from taskutils.replication.needle import NEEDLE_RE, filler_sentence, make_document, split_numbers
from taskutils.replication.reader import build_tokenizer, reader_config
from taskutils.verifiers.strict import strict_score

CHUNK_SIZE = 64
MEMORY_TOKENS = 32
FINAL_TOKENS = 16
Row = tuple[list[int], list[int]]  # (prompt ids, target ids incl. eos)


def agent_config(max_chunks: int | None = None) -> MemoryConfig:
    """The agent of the replication: 64-token chunks, 32-token memory, boxed final answer."""
    return MemoryConfig(
        chunk_size=CHUNK_SIZE,
        max_memorization_length=MEMORY_TOKENS,
        max_chunks=max_chunks,
        max_final_response_length=FINAL_TOKENS,
        max_prompt_length=64,
        final_prompt="boxed",
    )


def sample_of(doc: dict[str, Any]) -> dict[str, Any]:
    return {"context": doc["context"], "prompt": doc["question"]}


# ---------------------------------------------------------------------------------------------------------
# data of the four stages
# ---------------------------------------------------------------------------------------------------------


def synth_rows(tokenizer: Any, rng: random.Random, count: int, seq: int = 64, span: tuple[int, int] = (24, 30)):
    """Rows ``noise { x1..xk } noise {`` -> ``x1..xk }``: the repeat is pure induction."""
    vocab = len(tokenizer)
    first = 3  # ids below are the special tokens
    open_id, close_id = tokenizer.convert_tokens_to_ids("{"), tokenizer.convert_tokens_to_ids("}")
    rows: list[Row] = []
    for _ in range(count):
        k = rng.randint(*span)
        body = [rng.randrange(first, vocab) for _ in range(k)]
        noise = max(0, seq - 2 * (k + 2))
        pre = rng.randint(0, noise)
        prompt = [rng.randrange(first, vocab) for _ in range(pre)] + [open_id, *body, close_id]
        prompt += [rng.randrange(first, vocab) for _ in range(noise - pre)] + [open_id]
        rows.append((prompt, [*body, close_id]))
    return rows


def needle_rows(tokenizer: Any, rng: random.Random, count: int) -> list[Row]:
    """Bare chunk + "\\nmemory:" -> " needle" + eos (1-chunk train documents)."""
    rows = []
    for _ in range(count):
        doc = make_document(rng, tokenizer, 1, "train")
        prompt = tokenizer.encode(doc["context"] + "\nmemory:", add_special_tokens=False)
        rows.append(
            (prompt, tokenizer.encode(" " + doc["needle"], add_special_tokens=False) + [tokenizer.eos_token_id])
        )
    return rows


def paper_rows(workflow: MemoryWorkflow, rng: random.Random, count: int) -> list[Row]:
    """The paper's memory prompt of a 1-chunk train document (empty memory) -> needle + eos."""
    tokenizer = workflow.tokenizer
    rows = []
    for _ in range(count):
        doc = make_document(rng, tokenizer, 1, "train")
        turn = workflow.session(sample_of(doc)).next_turn()
        rows.append(
            (turn.prompt_ids, tokenizer.encode(doc["needle"], add_special_tokens=False) + [tokenizer.eos_token_id])
        )
    return rows


def complete_sentences(chunk_text: str, context: str) -> list[str]:
    """The context's sentences that lie whole in a chunk's text, in order."""
    found = [(chunk_text.find(s), s) for s in re.split(r"(?<=\.) ", context) if s and s in chunk_text]
    return [s for _, s in sorted(found)]


def teacher_transcript(
    workflow: MemoryWorkflow, doc: dict[str, Any], rng: random.Random, p_needle: float = 0.4, p_keep: float = 0.9
) -> list[tuple[str, Row, str]]:
    """The naive teacher's turns on one document, as (kind, (prompt ids, target ids), target text), built by
    running a real session on the teacher's replies (see the module docstring for the policy)."""
    tokenizer = workflow.tokenizer
    session = workflow.session(sample_of(doc))
    numbers = split_numbers("train")
    out = []
    while (turn := session.next_turn()) is not None:
        if turn.final:
            match = NEEDLE_RE.search(session.memory_text or "")
            text = f"\\boxed{{{match.group(2) if match else rng.choice(numbers)}}}"
        else:
            chunk = tokenizer.decode(session.context_ids[turn.meta["chunk"] * CHUNK_SIZE :][:CHUNK_SIZE])
            sentences = complete_sentences(chunk, doc["context"])
            fillers = [s for s in sentences if s != doc["needle"]] or [filler_sentence(rng)]
            memory = session.memory_text or ""
            if doc["needle"] in sentences:
                text = doc["needle"] if rng.random() < p_needle else fillers[0]
            elif doc["needle"] == memory and rng.random() < p_keep:
                text = memory
            else:
                text = fillers[0]
        ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        out.append(("final" if turn.final else "memory", (list(turn.prompt_ids), ids), text))
        session.record(Reply(text, "stop", ids))
    return out


# ---------------------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------------------


def batch_loss(model: Any, rows: list[Row], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Mean cross-entropy over the target tokens of ``rows`` (right-padded); also the target logits, labels and
    row index of every target token."""
    seqs = [p + t for p, t in rows]
    length = max(len(s) for s in seqs)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    rb, pos, labels, rid = [], [], [], []
    for i, ((prompt, _target), seq) in enumerate(zip(rows, seqs, strict=True)):
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
        for j in range(len(prompt), len(seq)):
            rb.append(i)
            pos.append(j - 1)
            labels.append(seq[j])
            rid.append(i)
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    logits = model.lm_head(hidden[rb, pos])
    labels_t = torch.tensor(labels)
    return F.cross_entropy(logits, labels_t), logits, labels_t, rid


@torch.no_grad()
def teacher_forced(model: Any, rows: list[Row], pad_id: int, batch: int = 64) -> dict[str, float]:
    """Per-token argmax accuracy and exact rows (every target token is the argmax: greedy reproduces it)."""
    model.eval()
    hit = total = exact = 0
    loss_sum = 0.0
    for start in range(0, len(rows), batch):
        part = rows[start : start + batch]
        loss, logits, labels, rid = batch_loss(model, part, pad_id)
        ok = (logits.argmax(-1) == labels).tolist()
        hit, total, loss_sum = hit + sum(ok), total + len(ok), loss_sum + loss.item() * len(ok)
        per: dict[int, bool] = {}
        for r, o in zip(rid, ok, strict=True):
            per[r] = per.get(r, True) and o
        exact += sum(per.values())
    model.train()
    return {"tok_acc": round(hit / total, 3), "exact": round(exact / len(rows), 3), "loss": round(loss_sum / total, 3)}


def train_stage(
    model: Any,
    name: str,
    sample: Any,
    held: list[Row],
    pad_id: int,
    lr: float,
    warmup: int,
    minutes: float,
    stop_key: str | None,
    stop_at: float = 0.9,
    batch: int = 32,
    eval_every: int = 25,
    log: Any = print,
) -> dict[str, Any]:
    """AdamW (betas 0.9/0.98, no weight decay, clip 1.0, linear warm-up) on ``sample(batch)`` until
    ``stop_key`` of the held-out rows reaches ``stop_at`` or ``minutes`` of training time pass."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    train_s, step, tokens, losses, curve = 0.0, 0, 0, [], []
    model.train()
    while True:
        rows = sample(batch)
        t0 = time.perf_counter()
        loss, *_ = batch_loss(model, rows, pad_id)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        train_s += time.perf_counter() - t0
        step += 1
        tokens += sum(len(p) + len(t) for p, t in rows)
        losses.append(loss.item())
        out_of_time = train_s > minutes * 60
        if step % eval_every == 0 or out_of_time:
            res = teacher_forced(model, held, pad_id)
            rec = {"stage": name, "step": step, "train_min": round(train_s / 60, 2), "tokens": tokens}
            rec |= {"train_loss": round(sum(losses[-eval_every:]) / len(losses[-eval_every:]), 3), **res}
            curve.append(rec)
            log(json.dumps(rec))
            if out_of_time or (stop_key is not None and res[stop_key] >= stop_at):
                break
    return {
        "stage": name,
        "steps": step,
        "train_s": round(train_s, 1),
        "tokens": tokens,
        "tok_per_s": round(tokens / train_s),
        "lr": lr,
        "final": curve[-1],
        "curve": curve,
    }


def build(
    out: Path,
    p_needle: float = 0.4,
    p_keep: float = 0.9,
    seed: int = 0,
    minutes: tuple[float, float, float, float] = (3.0, 2.0, 3.0, 5.0),
    log: Any = print,
) -> dict[str, Any]:
    """Build the warm start into ``out`` (a Hugging Face folder); returns the recipe with stage logs."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    pad = tokenizer.pad_token_id
    model = AutoModelForCausalLM.from_config(reader_config(tokenizer), attn_implementation="sdpa")
    model.generation_config.pad_token_id = pad
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    workflow = MemoryWorkflow(agent_config(), tokenizer)
    rng, held_rng = random.Random(f"train-{seed}"), random.Random(f"held-{seed}")
    stages = []

    t = time.perf_counter()
    held = synth_rows(tokenizer, held_rng, 256)
    stages.append(
        train_stage(
            model,
            "synth",
            lambda n: synth_rows(tokenizer, rng, n),
            held,
            pad,
            3e-3,
            100,
            minutes[0],
            "tok_acc",
            log=log,
        )
    )

    pool, held = needle_rows(tokenizer, rng, 3000), needle_rows(tokenizer, held_rng, 200)
    stages.append(
        train_stage(model, "needle", lambda n: rng.sample(pool, n), held, pad, 3e-3, 100, minutes[1], "exact", log=log)
    )

    pool, held = paper_rows(workflow, rng, 3000), paper_rows(workflow, held_rng, 200)
    stages.append(
        train_stage(model, "paper", lambda n: rng.sample(pool, n), held, pad, 1e-3, 20, minutes[2], "exact", log=log)
    )

    def transcripts(r: random.Random, count: int) -> list[Row]:
        rows = []
        for i in range(count):
            doc = make_document(r, tokenizer, 1 + i % 4, "train")
            rows += [row for _, row, _ in teacher_transcript(workflow, doc, r, p_needle, p_keep)]
        return rows

    pool, held = transcripts(rng, 2400), transcripts(held_rng, 60)
    stages.append(
        train_stage(
            model, "naive", lambda n: rng.sample(pool, n), held, pad, 1e-3, 20, minutes[3], None, eval_every=50, log=log
        )
    )
    recipe = {
        "reader": {"params": sum(p.numel() for p in model.parameters()), "vocab": len(tokenizer)},
        "teacher": {"p_needle": p_needle, "p_keep": p_keep, "filler": "first complete sentence of the chunk"},
        "seed": seed,
        "stages": stages,
        "build_wall_s": round(time.perf_counter() - t, 1),
    }
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "warm_start.json").write_text(json.dumps(recipe, indent=1) + "\n")
    return recipe


# ---------------------------------------------------------------------------------------------------------
# evaluation with the real agent
# ---------------------------------------------------------------------------------------------------------


class HFGenerate:
    """A ``generate(i, turn)`` callable for :func:`recurrent.lockstep.run_lockstep`: one Hugging Face
    ``generate`` call per turn on its token prompt, greedy or sampled (temperature 1)."""

    def __init__(self, model: Any, tokenizer: Any, sample: bool = False, seed: int = 0) -> None:
        self.model, self.tokenizer, self.sample = model, tokenizer, sample
        self.generator_seed = seed
        self.tokens = 0
        self.seconds = 0.0
        torch.manual_seed(seed)

    async def __call__(self, i: int, turn: Turn) -> Reply:
        t0 = time.perf_counter()
        ids = torch.tensor([turn.prompt_ids])
        kwargs = (
            {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if self.sample else {"do_sample": False}
        )
        with torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=turn.max_tokens,
                eos_token_id=self.tokenizer.eos_token_id,
                pad_token_id=self.tokenizer.pad_token_id,
                **kwargs,
            )
        new = out[0, ids.shape[1] :].tolist()
        stopped = self.tokenizer.eos_token_id in new
        if stopped:
            new = new[: new.index(self.tokenizer.eos_token_id) + 1]
        seconds = time.perf_counter() - t0
        self.tokens += len(turn.prompt_ids) + len(new)
        self.seconds += seconds
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        return Reply(text, "stop" if stopped else "length", new, len(turn.prompt_ids), len(new), seconds)


def evaluate(
    folder: Path, docs: int = 32, chunks: tuple[int, ...] = (1, 2, 4), sample: bool = False, split: str = "validation"
) -> dict[str, Any]:
    """Strict accuracy per length of the memory agent driven by the model in ``folder``, plus how often the
    final memory holds the needle sentence / the needle's number, and generation tokens/s."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    workflow = MemoryWorkflow(agent_config(), tokenizer)
    results = {}
    for n in chunks:
        documents = [make_document(random.Random(f"eval-{split}-{n}-{k}"), tokenizer, n, split) for k in range(docs)]
        sessions = [workflow.session(sample_of(d)) for d in documents]
        generate = HFGenerate(model, tokenizer, sample=sample, seed=n)
        t0 = time.perf_counter()
        run = asyncio.run(run_lockstep(sessions, generate))
        wall = time.perf_counter() - t0
        scores = [strict_score(s.answer or "", [d["value"]]) for s, d in zip(sessions, documents, strict=True)]
        final_memory = [(s.memory_trace[-1] if s.memory_trace else "") for s in sessions]
        # The memory written on the needle's own chunk: did the reader copy the needle when it saw it?
        written = [
            d["needle"] in s.memory_trace[d["needle_chunk"]]
            for s, d in zip(sessions, documents, strict=True)
            if len(s.memory_trace) > d["needle_chunk"]
        ]
        results[n] = {
            "docs": docs,
            "strict": round(sum(scores) / docs, 3),
            "needle_in_memory": round(
                sum(d["needle"] in m for d, m in zip(documents, final_memory, strict=True)) / docs, 3
            ),
            "number_in_memory": round(
                sum(d["value"] in m for d, m in zip(documents, final_memory, strict=True)) / docs, 3
            ),
            "needle_written": round(sum(written) / docs, 3),
            "boxed": round(sum("\\boxed{" in (s.answer or "") for s in sessions) / docs, 3),
            "failed": run.num_failed,
            "wall_s": round(wall, 1),
            "tok_per_s": round(generate.tokens / generate.seconds),
            "example": {
                "memories": sessions[0].memory_trace,
                "answer": sessions[0].answer,
                "gold": documents[0]["value"],
            },
        }
    return {"folder": str(folder), "split": split, "sample": sample, "lengths": results}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m taskutils.replication.warm_start", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, help="build the warm start into this folder")
    parser.add_argument("--evaluate", type=Path, help="evaluate the warm start in this folder")
    parser.add_argument("--p-needle", type=float, default=0.4)
    parser.add_argument("--p-keep", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--minutes", type=float, nargs=4, default=[3.0, 2.0, 3.0, 5.0], help="caps of the 4 stages")
    parser.add_argument("--docs", type=int, default=32, help="validation documents per length")
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--sample", action="store_true", help="sample (temperature 1) instead of greedy")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not args.out and not args.evaluate:
        parser.error("give --out (build) or --evaluate (measure)")
    if args.out:
        recipe = build(
            args.out, args.p_needle, args.p_keep, args.seed, tuple(args.minutes), log=lambda s: print(s, flush=True)
        )
        print(json.dumps({k: v for k, v in recipe.items() if k != "stages"}))
    folder = args.evaluate or args.out
    result = evaluate(folder, args.docs, tuple(args.chunks), args.sample)
    print(json.dumps(result, indent=1), flush=True)


if __name__ == "__main__":
    main()
