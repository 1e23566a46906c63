"""The decisions probe (experiments/needle/decisions.py): the rows of its three choices, checked by decoding them, and
its report on a tiny random reader."""

from __future__ import annotations

import random

import pytest
import torch

from experiments.needle.decisions import choice_rows, decisions
from experiments.needle.needle import NEEDLE_RE
from experiments.needle.reader import build_tokenizer, reader_config
from experiments.needle.warm_start import agent_config
from recurrent.impls.memory import MemoryWorkflow


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_the_rows_of_each_choice(tokenizer):
    rows = choice_rows(MemoryWorkflow(agent_config(), tokenizer), random.Random(3), 4)
    assert len(rows["invents"]) == 4 and all(len(rows[k]) <= 4 for k in ("write", "keep", "overwrite"))
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    for (prompt, needle), (same, filler) in rows["write"]:
        assert prompt == same and "No previous memory" in decode(prompt)
        assert NEEDLE_RE.fullmatch(decode(needle)) and not NEEDLE_RE.search(decode(filler))
        assert needle[-1] == filler[-1] == tokenizer.eos_token_id
    section = lambda ids: decode(ids).split("<section>")[1]  # noqa: E731  (the chunk, after the memory)
    memory = lambda ids: decode(ids).split("<memory>")[1].split("</memory>")[0]  # noqa: E731
    for (prompt, needle), (_, filler) in rows["keep"]:  # the needle in memory, the other chunk shown
        assert memory(prompt).strip() == decode(needle[:-1]) and decode(needle[:-1]) not in section(prompt)
        assert not NEEDLE_RE.search(decode(filler)) and decode(filler[:-1]) in section(prompt)
    for (prompt, needle), (_, invented) in rows["overwrite"]:
        real, made_up = NEEDLE_RE.fullmatch(decode(needle)), NEEDLE_RE.fullmatch(decode(invented))
        assert real[1] == made_up[1] and real[2] != made_up[2]  # the asked key, another number
        assert memory(prompt).strip() == decode(invented[:-1]) and decode(needle[:-1]) in section(prompt)


def test_a_random_readers_report(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(reader_config(tokenizer, hidden=32, layers=1, heads=2, kv_heads=1))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    report = decisions(tmp_path, docs=3)
    for kind in ("write", "keep", "overwrite"):
        assert 1 <= report[kind]["documents"] <= 3
        assert 0.0 <= report[kind]["prefers_needle"] <= 1.0 and 0.0 <= report[kind]["p_needle_of_two"] <= 1.0
    assert report["invents"] == {"documents": 3, "share": 0.0}  # a random reader writes no magic number
