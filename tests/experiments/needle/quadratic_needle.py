"""The needle documents' generator as it was before it became linear (docs/replication_cpu_notebook.md, "The
documents' generator"): it re-encodes the whole document for every filler sentence it adds and for every needle
position it tries, so its time grows with the square of the length. Kept only here, as the reference that
``test_generator.py`` compares today's generator with (the same documents and the same random stream, byte for
byte) and that ``scripts/bench_needle_documents.py`` times beside it. A verbatim copy of ``make_document``,
``make_choice_document`` and ``make_late_start`` of experiments/needle/needle.py at that commit."""

from __future__ import annotations

import random
from typing import Any

from experiments.needle.needle import (
    CHUNK_SIZE,
    NEEDLE,
    QUESTION,
    chunk_texts,
    filler_sentence,
    split_keys,
    split_numbers,
)
from recurrent.tokens import encode_long


def make_document(
    rng: random.Random, tokenizer: Any, n_chunks: int, split: str, chunk_size: int = CHUNK_SIZE
) -> dict[str, Any]:
    """One document of exactly ``n_chunks`` chunks of ``chunk_size`` reader tokens, with one needle of ``split``
    lying whole inside a chunk drawn uniformly (see the module docstring)."""
    if n_chunks < 1:
        raise ValueError("n_chunks must be >= 1")
    key, value = rng.choice(split_keys(split)), str(rng.choice(split_numbers(split)))
    needle = NEEDLE.format(key=key, value=value)
    lo, hi = chunk_size * (n_chunks - 1) + 1, chunk_size * n_chunks
    for _attempt in range(100):
        # Fill to at most hi tokens (needle included), then place the needle in a uniformly drawn chunk.
        sentences: list[str] = []
        while True:
            candidate = [*sentences, filler_sentence(rng)]
            if len(encode_long(" ".join([needle, *candidate]), tokenizer)) > hi:
                break
            sentences = candidate
        target = rng.randrange(n_chunks)
        positions = list(range(len(sentences) + 1))
        rng.shuffle(positions)
        for pos in positions:
            context = " ".join([*sentences[:pos], needle, *sentences[pos:]])
            ids = encode_long(context, tokenizer)
            if not lo <= len(ids) <= hi:
                continue
            holding = [c for c, text in enumerate(chunk_texts(ids, tokenizer, chunk_size)) if needle in text]
            if holding == [target]:
                return {
                    "key": key,
                    "value": value,
                    "needle": needle,
                    "needle_chunk": target,
                    "num_chunks": n_chunks,
                    "question": QUESTION.format(key=key),
                    "context": context,
                    "num_tokens": len(ids),
                }
    raise RuntimeError(f"could not place a needle in a {n_chunks}-chunk document")


def make_choice_document(
    rng: random.Random, tokenizer: Any, n_chunks: int, split: str, distractors: int, chunk_size: int = CHUNK_SIZE
) -> dict[str, Any]:
    """A document of :func:`make_document`'s shape holding ``1 + distractors`` needles of distinct keys and
    numbers of ``split``, each whole inside one chunk; the question asks for the first (the asked needle), whose
    chunk is drawn uniformly. The others lie wherever their random place in the filler puts them."""
    if distractors < 1:
        raise ValueError(f"distractors must be >= 1 for a choice, got {distractors}")
    keys = rng.sample(split_keys(split), 1 + distractors)
    values = [str(v) for v in rng.sample(split_numbers(split), 1 + distractors)]
    needles = [NEEDLE.format(key=k, value=v) for k, v in zip(keys, values, strict=True)]
    lo, hi = chunk_size * (n_chunks - 1) + 1, chunk_size * n_chunks
    target = rng.randrange(n_chunks)

    def tokens(text: str) -> int:  # what a sentence adds after another (byte-level BPE: no token spans the space)
        return len(tokenizer.encode(" " + text, add_special_tokens=False))

    for _fill in range(20):
        sentences: list[str] = []
        while True:
            candidate = [*sentences, filler_sentence(rng)]
            if len(encode_long(" ".join([*needles, *candidate]), tokenizer)) > hi:
                break
            sentences = candidate
        for _attempt in range(20):
            # The distractors at random places; then the asked needle at a place whose first token falls in the
            # target chunk by the sentences' token counts (checked below on the real encoding).
            parts = list(sentences)
            for needle in needles[1:]:
                parts.insert(rng.randint(0, len(parts)), needle)
            starts, offset = [], 0
            for part in parts:
                starts.append(offset)
                offset += tokens(part)
            starts.append(offset)
            room = chunk_size - tokens(needles[0])
            places = [i for i, at in enumerate(starts) if target * chunk_size <= at <= target * chunk_size + room]
            if not places:
                continue
            parts.insert(rng.choice(places), needles[0])
            context = " ".join(parts)
            ids = encode_long(context, tokenizer)
            if not lo <= len(ids) <= hi:
                continue
            texts = chunk_texts(ids, tokenizer, chunk_size)
            holding = [[c for c, text in enumerate(texts) if needle in text] for needle in needles]
            if all(len(h) == 1 for h in holding) and holding[0] == [target]:
                return {
                    "key": keys[0],
                    "value": values[0],
                    "needle": needles[0],
                    "needle_chunk": target,
                    "num_chunks": n_chunks,
                    "question": QUESTION.format(key=keys[0]),
                    "context": context,
                    "num_tokens": len(ids),
                    "distractors": [
                        {"key": k, "value": v, "chunk": h[0]}
                        for k, v, h in zip(keys[1:], values[1:], holding[1:], strict=True)
                    ],
                }
    raise RuntimeError(f"could not place {1 + distractors} needles in a {n_chunks}-chunk document")


def make_late_start(
    rng: random.Random, tokenizer: Any, n_chunks: int, split: str, chunk_size: int = CHUNK_SIZE
) -> dict[str, Any]:
    """An episode that starts late: the memory already holds the needle sentence (as if it had been read in an
    earlier part of the document) and the context is ``n_chunks`` chunks of filler only. The answer depends only on
    keeping the needle; ``needle_chunk`` is -1 (before the context) and ``memory`` the needle sentence."""
    if n_chunks < 1:
        raise ValueError("n_chunks must be >= 1")
    key, value = rng.choice(split_keys(split)), str(rng.choice(split_numbers(split)))
    lo, hi = chunk_size * (n_chunks - 1) + 1, chunk_size * n_chunks
    sentences: list[str] = []
    while True:
        candidate = [*sentences, filler_sentence(rng)]
        if len(encode_long(" ".join(candidate), tokenizer)) > hi:
            break
        sentences = candidate
    context = " ".join(sentences)
    tokens = len(encode_long(context, tokenizer))
    if not lo <= tokens <= hi:  # a filler sentence is far shorter than a chunk: the fill always ends in range
        raise RuntimeError(f"a late-start context of {tokens} tokens for {n_chunks} chunks")
    needle = NEEDLE.format(key=key, value=value)
    return {
        "key": key,
        "value": value,
        "needle": needle,
        "needle_chunk": -1,
        "num_chunks": n_chunks,
        "question": QUESTION.format(key=key),
        "context": context,
        "num_tokens": tokens,
        "memory": needle,
    }
