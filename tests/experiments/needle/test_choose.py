"""The choosing task: documents with the asked needle and others of other keys, each whole in one chunk; only the
asked key's number is the answer, and the memory holds two needle sentences at most."""

import json
import random
import re
from collections import Counter

import pytest

from experiments.needle.data import main
from experiments.needle.needle import (
    NEEDLE,
    QUESTION,
    make_choice_document,
    make_documents,
    split_keys,
    split_numbers,
)
from experiments.needle.reader import build_tokenizer
from recurrent.impls.memory import MemoryConfig, MemoryWorkflow


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.mark.parametrize("n", [1, 2, 4, 16])
def test_every_needle_lies_whole_in_one_chunk_and_the_question_asks_the_first(tokenizer, n):
    workflow = MemoryWorkflow(MemoryConfig(chunk_size=64, max_chunks=None), tokenizer)
    for k in range(4):
        doc = make_choice_document(random.Random(f"{n}-{k}"), tokenizer, n, "test", distractors=3)
        # the agent's own chunking, decoded independently of the generator
        session = workflow.episode({"context": doc["context"], "prompt": doc["question"]})
        assert session.num_chunks == n
        texts = [tokenizer.decode(session.context_ids[i * 64 : (i + 1) * 64]) for i in range(n)]
        found = {
            m.group(1): (m.group(2), c) for c, t in enumerate(texts) for m in re.finditer(r"for (\S+) is (\d{4})\.", t)
        }
        assert len(found) == 4  # four needles, each whole in a chunk
        assert found[doc["key"]] == (doc["value"], doc["needle_chunk"])
        assert {d["key"]: (d["value"], d["chunk"]) for d in doc["distractors"]} == {
            key: v for key, v in found.items() if key != doc["key"]
        }
        assert doc["question"] == QUESTION.format(key=doc["key"]) and doc["needle"] == NEEDLE.format(
            key=doc["key"], value=doc["value"]
        )
        assert all(
            key in split_keys("test") and int(value) in split_numbers("test") for key, (value, _) in found.items()
        )
        assert len({value for value, _ in found.values()}) == 4


def test_the_asked_needles_chunk_is_drawn_uniformly(tokenizer):
    docs = make_documents(tokenizer, "train", 80, [4], seed=1, distractors=2)
    counts = Counter(d["needle_chunk"] for d in docs)
    assert set(counts) == {0, 1, 2, 3} and min(counts.values()) >= 10  # binomial(80, 1/4): 20 +- 3.9
    assert all(len(d["distractors"]) == 2 for d in docs)


def test_the_memory_holds_two_needle_sentences_at_most(tokenizer):
    # the premise of the task: 32 memory tokens (the replication's budget) hold two needle sentences, not three
    sentences = [NEEDLE.format(key=k, value=v) for k, v in (("brave-otter", "7445"), ("calm-heron", "1984"))]
    three = " ".join([*sentences, NEEDLE.format(key="odd-tiger", value="4711")])
    assert len(tokenizer.encode(" ".join(sentences), add_special_tokens=False)) <= 32
    assert len(tokenizer.encode(three, add_special_tokens=False)) > 32


def test_the_choosing_task_refuses_late_starts_and_no_distractors(tokenizer):
    with pytest.raises(ValueError, match="no late or decoy"):
        make_documents(tokenizer, "train", 2, [1], late_start=0.5, distractors=2)
    with pytest.raises(ValueError, match="distractors must be >= 1"):
        make_choice_document(random.Random(0), tokenizer, 1, "train", distractors=0)


def test_the_data_command_writes_the_choosing_tasks_files(tmp_path, capsys):
    main(["--out", str(tmp_path), "--train", "4", "--validation", "1", "--test", "2", "--eval-chunks", "1", "2",
          "--distractors", "3", "--task", "choose"])  # fmt: skip
    lines = [json.loads(x) for x in (tmp_path / "eval" / "test" / "eval_choose_2.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(len(re.findall(r"magic number for", x["context"])) == 4 for x in lines)
    assert not (tmp_path / "eval" / "test" / "eval_needle_2.jsonl").exists()
    import pandas as pd

    train = pd.read_parquet(tmp_path / "train.parquet")
    assert len(train) == 4 and all(len(e["distractor_chunks"]) == 3 for e in train["extra_info"])
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--distractors", "2", "--late-start", "0.5"])
    assert "takes no --late-start" in capsys.readouterr().err
