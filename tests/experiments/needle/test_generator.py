"""The needle documents' generator, linear in the length, writes the documents the quadratic one wrote
(``quadratic_needle.py``, a verbatim copy of it): for every seed and length below, the same document and the same
random stream after it, so every later document of a file is the same too. Checked with the tokenizer as built
and as loaded from a reader folder (transformers' Qwen2 tokenizer, the one the data command uses)."""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest
import quadratic_needle as old

from experiments.needle import needle
from experiments.needle.reader import build_tokenizer

built = functools.cache(build_tokenizer)  # one BPE training for the module (it takes seconds)


@pytest.fixture(scope="module", params=["built", "folder"])
def tokenizer(request, tmp_path_factory):
    if request.param == "built":
        return built()
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("reader")
    built().save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def same(name, seed, *args):
    """Both generators' ``name`` from the same random stream: the same document, and the stream left in the same
    state."""
    new_rng, old_rng = random.Random(seed), random.Random(seed)
    assert getattr(needle, name)(new_rng, *args) == getattr(old, name)(old_rng, *args)
    assert new_rng.getstate() == old_rng.getstate()


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 16, 32])
@pytest.mark.parametrize("split", ["train", "test"])
def test_the_documents_are_those_of_the_quadratic_generator(tokenizer, n, split):
    for seed in range(3 if n <= 8 else 1):  # the quadratic generator is slow at length
        same("make_document", f"{seed}-{n}", tokenizer, n, split)


@pytest.mark.parametrize("n", [1, 2, 4, 16])
def test_the_late_starts_and_choosing_documents_are_those_of_the_quadratic_generator(tokenizer, n):
    for seed in range(3):
        same("make_late_start", seed, tokenizer, n, "train")
        for distractors in (1, 3):
            same("make_choice_document", f"{seed}-{distractors}", tokenizer, n, "test", distractors)


def test_a_file_of_documents_is_the_same():
    """A whole stream (make_documents: one random stream through every document), lengths mixed."""
    tokenizer = built()
    docs = needle.make_documents(tokenizer, "validation", 12, [1, 2, 3, 4, 6, 9], seed=5)
    rng = random.Random("5-validation")
    assert docs == [old.make_document(rng, tokenizer, [1, 2, 3, 4, 6, 9][i % 6], "validation") for i in range(12)]


def test_a_tokenizer_that_merges_across_sentences_is_refused():
    """The counts by addition hold only for a tokenizer that never merges across the space between sentences; the
    generator checks that on the document it returns."""
    tokens = needle.SentenceTokens(built())
    parts = ["The pilot found a warm coat.", "The special magic number for odd-otter is 1234."]
    joined = tokens.ids(parts[0], first=True) + tokens.ids(parts[1])
    tokens.check(parts, np.array(joined))
    with pytest.raises(RuntimeError, match="merges tokens across sentences"):
        tokens.check(parts, np.array(joined[:-1] + [joined[-1] + 1]))
