"""The warm start measured with the real agent: memory-agent episodes (:class:`~recurrent.impls.memory.MemoryWorkflow`)
driven by :func:`recurrent.generation_manager.run_lockstep` with a Hugging Face ``generate`` callable over validation
documents, the final answers scored with ``taskutils.verifiers.strict``."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import torch

from experiments.needle.needle import NEEDLE, NEEDLE_RE, make_choice_document, make_document, names_a_needle
from experiments.needle.survival import event
from experiments.needle.warm_start.rows import agent_config, sample_of
from recurrent.generation_manager import run_lockstep
from recurrent.impls.memory import MemoryWorkflow
from recurrent.interface import Reply, Turn
from taskutils.verifiers.strict import strict_score


class HFGenerate:
    """A ``generate(i, turn)`` callable for :func:`recurrent.generation_manager.run_lockstep`: one Hugging Face
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


def whole_needles(sessions: list[Any], documents: list[dict[str, Any]]) -> dict[str, Any]:
    """Of the choosing task's memories that name a needle (every memory after every chunk that mentions a magic
    number or holds a 4-digit number), the share that is exactly one of the document's needles, as a sentence or as
    a bare number (not a blend of several), and the share that is the asked one."""
    mentions = whole = asked = 0
    for session, doc in zip(sessions, documents, strict=True):
        pairs = [NEEDLE_RE.fullmatch(doc["needle"]).groups(), *((d["key"], d["value"]) for d in doc["distractors"])]
        needles = {NEEDLE.format(key=k, value=v) for k, v in pairs} | {v for _, v in pairs}
        for memory in session.memory_trace:
            if names_a_needle(memory):
                mentions += 1
                whole += memory.strip() in needles
                asked += memory.strip() in (doc["needle"], pairs[0][1])
    share = (lambda k: round(k / mentions, 3)) if mentions else (lambda k: 0.0)
    return {"needle_memories": mentions, "whole_needle": share(whole), "asked_needle": share(asked)}


def keeping(sessions: list[Any], documents: list[dict[str, Any]]) -> dict[str, int]:
    """The needle's number through the memories (:func:`experiments.needle.survival.event`): in how many documents
    it was written, the keep decisions after the writes (chunks read while it was intact) and the losses among them;
    1 - losses / decisions is the keep rate per chunk."""
    events = [
        event(
            "", "", len(s.memory_trace), {"id": i, "gold": [d["value"]], "memories": s.memory_trace}, d["needle_chunk"]
        )
        for i, (s, d) in enumerate(zip(sessions, documents, strict=True))
    ]
    written = [e for e in events if e.written is not None]
    return {
        "written": len(written),
        "keep_decisions": sum(e.decisions for e in written),
        "losses": sum(e.lost is not None for e in written),
    }


def evaluate(
    folder: Path,
    docs: int = 32,
    chunks: tuple[int, ...] = (1, 2, 4),
    sample: bool = False,
    split: str = "validation",
    distractors: int = 0,
) -> dict[str, Any]:
    """Strict accuracy per length of the memory agent driven by the model in ``folder``, plus how often the
    final memory holds the needle sentence / the needle's number, and generation tokens/s. ``distractors``: the
    choosing task's documents with that many other needles (the needle: the asked one); else also how long the
    needle's number is kept once written (:func:`keeping`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    workflow = MemoryWorkflow(agent_config(), tokenizer)
    results = {}
    for n in chunks:
        documents = [
            make_choice_document(random.Random(f"eval-{split}-{n}-{k}"), tokenizer, n, split, distractors)
            if distractors
            else make_document(random.Random(f"eval-{split}-{n}-{k}"), tokenizer, n, split)
            for k in range(docs)
        ]
        sessions = [workflow.episode(sample_of(d)) for d in documents]
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
            **(whole_needles(sessions, documents) if distractors else keeping(sessions, documents)),
            "failed": run.num_failed,
            "wall_s": round(wall, 1),
            "tok_per_s": round(generate.tokens / generate.seconds),
            "example": {
                "memories": sessions[0].memory_trace,
                "answer": sessions[0].answer,
                "gold": documents[0]["value"],
            },
        }
    out = {"folder": str(folder), "split": split, "sample": sample, "lengths": results}
    return out | ({"distractors": distractors} if distractors else {})
