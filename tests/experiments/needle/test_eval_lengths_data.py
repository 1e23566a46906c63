"""The test documents of each evaluation length are samples of their own (experiments/needle/data.py): built as
scripts/replicate_cpu.sh builds them (``--train 0 --validation 0 --test N --eval-chunks ...``, the short lengths and
the long ones in two commands), no needle of one length's file is in another's, the first documents included (drawn
from one random state, every length's first document would hold the same needle)."""

from __future__ import annotations

import itertools
import json

import pytest

from experiments.needle.data import main
from experiments.needle.reader import build_tokenizer


@pytest.fixture(scope="module")
def reader_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reader")
    build_tokenizer().save_pretrained(folder)
    return folder


def needles(path) -> list[tuple[str, str]]:
    """Each item's needle: the key its question asks and the number."""
    items = [json.loads(line) for line in path.read_text().splitlines()]
    return [(item["input"].split(" for ")[1].split(" mentioned")[0], item["answers"][0]) for item in items]


@pytest.mark.timeout(120)
def test_each_lengths_test_documents_hold_needles_of_their_own(tmp_path, reader_folder):
    out = tmp_path / "eval_data"
    for lengths in (["8"], ["1", "2", "4"]):  # the long lengths first, as the script builds them
        argv = ["--out", str(out), "--tokenizer", str(reader_folder), "--train", "0", "--validation", "0"]
        main([*argv, "--test", "3", "--eval-chunks", *lengths])
    found = {n: needles(out / "eval" / "test" / f"eval_needle_{n}.jsonl") for n in (1, 2, 4, 8)}
    assert all(len(pairs) == 3 for pairs in found.values())
    for a, b in itertools.combinations(found, 2):
        assert found[a][0] != found[b][0], f"the first documents of {a} and {b} chunks share their needle"
        assert not set(found[a]) & set(found[b]), f"{a} and {b} chunks share a needle"
