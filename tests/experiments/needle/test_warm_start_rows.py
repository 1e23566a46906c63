"""The warm start's training rows and evaluation did not change when the memory agent became an async function.

``data/warm_start_rows.json`` was captured with the memory agent written as a state machine (before it became an
async function over the chat client), for fixed seeds: the ``paper`` stage's rows, naive-teacher transcripts of
documents of 1 to 4 chunks (every turn's prompt ids, target ids and text), and :func:`warm_start.evaluate` of a tiny
random reader, greedy and sampled (the sampled run draws in lockstep call order, so it also pins the order of the
calls). Today's code must give the same, token for token.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from experiments.needle.needle import make_document
from experiments.needle.reader import build_tokenizer, reader_config
from experiments.needle.warm_start import agent_config, evaluate, paper_rows, teacher_transcript
from recurrent.impls.memory import MemoryWorkflow

FIXTURE = json.loads((Path(__file__).parent / "data" / "warm_start_rows.json").read_text())


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(corpus="task")  # the tokenizer of the capture (the default before recipe 4)


def test_the_paper_rows_are_unchanged(tokenizer):
    rows = paper_rows(MemoryWorkflow(agent_config(), tokenizer), random.Random("fixture-paper"), 4)
    assert [[list(prompt), list(target)] for prompt, target in rows] == FIXTURE["paper_rows"]


def test_the_teacher_transcripts_are_unchanged(tokenizer):
    workflow = MemoryWorkflow(agent_config(), tokenizer)
    assert [t["chunks"] for t in FIXTURE["transcripts"]] == [1, 2, 3, 4, 1, 2]  # every length, final turns last
    for expected in FIXTURE["transcripts"]:
        rng = random.Random(f"fixture-teacher-{expected['seed']}")
        doc = make_document(rng, tokenizer, expected["chunks"], "train")
        turns = teacher_transcript(workflow, doc, rng, 0.4, 0.9)
        assert [[kind, [list(p), list(t)], text] for kind, (p, t), text in turns] == expected["turns"]
        assert [kind for kind, _, _ in turns] == ["memory"] * expected["chunks"] + ["final"]


def test_the_evaluation_of_a_tiny_reader_is_unchanged(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(reader_config(tokenizer, hidden=32, layers=1, heads=2, kv_heads=1))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    for sample in (False, True):
        lengths = evaluate(tmp_path, docs=3, chunks=(1, 3), sample=sample)["lengths"]
        for result in lengths.values():
            del result["wall_s"], result["tok_per_s"]  # timings
            # added since the capture: the needle's number written and kept (a random reader writes none)
            assert {k: result.pop(k) for k in ("written", "keep_decisions", "losses")}["keep_decisions"] >= 0
        assert json.loads(json.dumps(lengths)) == FIXTURE["evaluate"][str(sample)]
