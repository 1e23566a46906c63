"""How a reader decides, teacher-forced: the two choices its naive teacher makes, scored by the reader itself.

    python -m experiments.needle.decisions FOLDER [--docs 200] [--split validation]

On 2-chunk documents of the validation split, three choices: ``write``, on the needle's chunk (memory empty), the
needle sentence against the chunk's first filler sentence (what the naive teacher writes, with probability
``p_needle`` and the rest); ``keep``, on the other chunk with the needle sentence in memory, keeping it against the
chunk's first sentence (``p_keep`` and the rest); ``overwrite``, on the needle's chunk with the asked key's needle
sentence and another number in memory (an invented number), the real needle against keeping the memory. For each:
the share of documents whose reader gives the first the higher probability (sequence log-probability, eos
included), and the mean of P(first) / (P(first) + P(second)). A greedy reader follows the higher one where the two
are its top choices. And ``invents``: the share of the filler chunks (memory empty) on which the greedy memory is a
needle sentence ("magic number"), a number the reader made up and will keep
(docs/replication_cpu_notebook.md, "The cause, measured").
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path
from typing import Any

import torch

from experiments.needle.needle import NEEDLE, make_document, split_numbers
from experiments.needle.warm_start.rows import agent_config, sample_of
from experiments.needle.warm_start.teachers import complete_sentences
from experiments.sft import Row, batch_loss
from recurrent.impls.memory import Memory, MemoryWorkflow


def choice_rows(workflow: MemoryWorkflow, rng: random.Random, docs: int) -> dict[str, list[tuple[Row, Row]]]:
    """For ``docs`` 2-chunk documents, the rows of each choice (the module docstring), the first row the needle;
    ``invents``: the filler chunk's prompt with an empty memory (both rows alike, no target)."""
    tokenizer = workflow.tokenizer
    eos = [tokenizer.eos_token_id]
    rows: dict[str, list[tuple[Row, Row]]] = {"write": [], "keep": [], "overwrite": [], "invents": []}
    numbers = split_numbers("validation")
    for _ in range(docs):
        doc = make_document(rng, tokenizer, 2, "validation")
        reading = workflow.prepare(sample_of(doc))
        chunks = list(reading.chunks())
        needle = tokenizer.encode(doc["needle"], add_special_tokens=False) + eos
        invented = NEEDLE.format(key=doc["key"], value=rng.choice([n for n in numbers if str(n) != doc["value"]]))
        at, other = doc["needle_chunk"], 1 - doc["needle_chunk"]
        for kind, chunk, memory in (("write", at, None), ("keep", other, doc["needle"]), ("overwrite", at, invented)):
            text = tokenizer.decode(chunks[chunk])
            fillers = [s for s in complete_sentences(text, doc["context"]) if s != doc["needle"]]
            if not fillers:
                continue
            prompt = reading.memory_prompt(Memory(memory) if memory else None, chunks[chunk]).ids
            second = invented if kind == "overwrite" else fillers[0]
            rows[kind].append(((prompt, needle), (prompt, tokenizer.encode(second, add_special_tokens=False) + eos)))
        prompt = reading.memory_prompt(None, chunks[other]).ids
        rows["invents"].append(((prompt, []), (prompt, [])))
    return rows


@torch.no_grad()
def log_probs(model: Any, rows: list[Row], pad_id: int, batch: int = 32) -> list[float]:
    """Each row's target log-probability (summed over its tokens)."""
    out = []
    for start in range(0, len(rows), batch):
        part = rows[start : start + batch]
        _, logits, targets, row_of = batch_loss(model, part, pad_id)
        token = torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0]
        sums = [0.0] * len(part)
        for r, value in zip(row_of, token.tolist(), strict=True):
            sums[r] += value
        out += sums
    return out


@torch.no_grad()
def greedy(model: Any, tokenizer: Any, prompt: list[int]) -> str:
    """The greedy memory of one memory turn."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False)
    return tokenizer.decode(out[0, len(prompt) :], skip_special_tokens=True)


def decisions(folder: Path, docs: int = 200, seed: int = 0) -> dict[str, Any]:
    """Both choices of the reader in ``folder`` on ``docs`` documents (see the module docstring)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    workflow = MemoryWorkflow(agent_config(), tokenizer)
    result: dict[str, Any] = {"folder": str(folder)}
    for kind, pairs in choice_rows(workflow, random.Random(f"decisions-{seed}"), docs).items():
        if kind == "invents":
            memories = [greedy(model, tokenizer, prompt) for (prompt, _), _ in pairs]
            result[kind] = {
                "documents": len(pairs),
                "share": round(sum("magic" in m for m in memories) / len(pairs), 3),
            }
            continue
        first = log_probs(model, [a for a, _ in pairs], tokenizer.pad_token_id)
        second = log_probs(model, [b for _, b in pairs], tokenizer.pad_token_id)
        share = [1 / (1 + math.exp(b - a)) for a, b in zip(first, second, strict=True)]
        result[kind] = {
            "documents": len(pairs),
            "prefers_needle": round(sum(a > b for a, b in zip(first, second, strict=True)) / len(pairs), 3),
            "p_needle_of_two": round(sum(share) / len(share), 3),
        }
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.needle.decisions", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("folder", type=Path, help="a reader folder (a warm start, an RL checkpoint's huggingface/)")
    parser.add_argument("--docs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(json.dumps(decisions(args.folder, args.docs, args.seed)))


if __name__ == "__main__":
    main()
