"""Exact windowed encoding of long documents, centre truncation and chunking, by hand."""

import logging
import random
from types import SimpleNamespace

import numpy as np
import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from recurrent.tokens import centre_truncate, encode_long, encode_windows, end_token_ids, iter_chunks, num_chunks

PIECES = [
    "Document 12:\n",
    "the magic number is 40213. ",
    "  spaced   out\n\n",
    "Brountalian ",
    "naïve café — 東京 ",
    "\t",
    "x" * 30,
    "1234567 ",
    "\n",
    "don't ",
    "“quoted” ",
]


def messy_text(seed: int, pieces: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(PIECES) for _ in range(pieces))


@pytest.mark.parametrize("model", ["tiny", "smollm2"])
def test_windowed_encoding_equals_whole_encoding(model, tiny_model_dir, smollm2_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir if model == "tiny" else smollm2_dir)
    text = messy_text(seed=3, pieces=6000)
    whole = np.asarray(tokenizer.encode(text, add_special_tokens=False))
    windowed = encode_long(text, tokenizer, window_chars=3000, margin_chars=200)  # ~20 seams
    assert windowed.dtype == np.int32 and np.array_equal(windowed, whole)


@pytest.mark.parametrize("model", ["tiny", "smollm2"])
@pytest.mark.parametrize("alphabet", ["abcdefghijklmnopqrstuvwxyz", "a", "東京大阪", "naïvecafé", "ab12"])
def test_text_without_word_starts_is_windowed_exactly(model, alphabet, tiny_model_dir, smollm2_dir, caplog):
    # No whitespace, no punctuation: each window is (mostly) one long pre-token, so it is cut at a token boundary
    # inside the word (a character boundary: byte-level tokens may split a character), not encoded whole.
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir if model == "tiny" else smollm2_dir)
    rng = random.Random(alphabet)
    text = "".join(rng.choice(alphabet) for _ in range(20_000))
    whole = np.asarray(tokenizer.encode(text, add_special_tokens=False))
    windows = []
    backend = tokenizer.backend_tokenizer
    encode = backend.encode

    class Counted:  # the backend, counting the texts it is given
        def encode(self, window, **kwargs):
            windows.append(len(window))
            return encode(window, **kwargs)

    with caplog.at_level(logging.WARNING, logger="recurrent.tokens"):
        windowed = np.concatenate(list(encode_windows(text, Counted(), window_chars=2000, margin_chars=200)))
    assert np.array_equal(windowed, whole)
    assert max(windows) <= 2000 and caplog.text == ""  # never the whole text at once
    # Each window moves on by at least half of the 1600 characters before its margins: at most 25 windows.
    assert len(windows) <= 20_000 // 800 + 1


def test_disagreeing_seams_fall_back_to_one_encode(caplog):
    # A tokenizer that marks the start of every input: a window that starts mid-text gets a marker that the
    # whole text has only once, so its seams disagree.
    raw = Tokenizer(models.BPE(unk_token="[UNK]"))
    raw.normalizer = normalizers.Prepend("#")
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.train_from_iterator(
        [messy_text(s, 50) for s in range(50)],
        trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"], show_progress=False),
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]")
    text = messy_text(seed=4, pieces=800)
    with caplog.at_level(logging.WARNING, logger="recurrent.tokens"):
        windowed = encode_long(text, tokenizer, window_chars=2000, margin_chars=100)
    assert np.array_equal(windowed, tokenizer.encode(text, add_special_tokens=False))
    assert "whole text" in caplog.text


def test_centre_truncation_and_chunks_by_hand():
    ids = np.arange(10)
    assert centre_truncate(ids, 6).tolist() == [0, 1, 2, 7, 8, 9]
    assert centre_truncate(ids, 7).tolist() == [0, 1, 2, 7, 8, 9]  # odd budgets keep 2 * (budget // 2)
    assert centre_truncate(ids, 10) is ids and centre_truncate(ids, None) is ids
    chunks = [c.tolist() for c in iter_chunks(ids, 4)]
    assert chunks == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert num_chunks(10, 4) == 3 and num_chunks(8, 4) == 2 and num_chunks(0, 4) == 0
    assert list(iter_chunks(np.arange(0), 4)) == []
    with pytest.raises(ValueError, match="chunk_size"):
        list(iter_chunks(ids, 0))


def test_end_token_ids_are_the_eos_and_pad_ids_the_tokenizer_has():
    assert end_token_ids(SimpleNamespace(eos_token_id=2, pad_token_id=0)) == frozenset({0, 2})
    assert end_token_ids(SimpleNamespace(eos_token_id=2, pad_token_id=None)) == frozenset({2})
    assert end_token_ids(SimpleNamespace(eos_token_id=5, pad_token_id=5)) == frozenset({5})
