"""Aggregation tasks: common words extraction (``cwe``) and frequent words extraction (``fwe``).

``cwe``: a numbered list where ``num_cw`` common words appear ``freq_cw`` times and the others ``freq_ucw``
times (6 and 1 below 4K tokens); the answer is the common words. The word list is the curated
noun/adjective/verb list shipped in ``ruler/words/`` (~2,200 words). When a length needs more distinct
words than that, both frequencies are multiplied by the same factor, keeping the 10:1 contrast (the
original ran out of words and did not generate ``cwe`` at long lengths).

``fwe``: coded words of six random letters with Zipf-like counts ``num_words * k**-alpha / zeta(alpha)``
(vocabulary ``length // 50``); the most frequent word is replaced by ``...`` and the answer is the next three.
"""

from __future__ import annotations

import math
import random
import string

from taskutils.memory_data.ruler.common import RulerSample, UnitTask
from taskutils.memory_data.ruler.haystack import word_list

CWE_TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
    "that appear most often. Question: What are the {num_cw} most common words in the above list?"
)
CWE_ANSWER_PREFIX = " Answer: The top {num_cw} words that appear most often in the list are:"
FWE_TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words. Question: Do not provide any explanation. Please ignore the dots '....'. What are the "
    "three most frequently appeared words in the above coded text?"
)
FWE_ANSWER_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"


class CommonWordsTask(UnitTask):
    """Units: uncommon-word occurrences groups (one uncommon word at base frequency)."""

    tokens_to_generate = 120
    guess_tokens_per_unit = 12.0

    def __init__(self, name: str, length: int, seed: int, tokenizer, freq_cw=30, freq_ucw=3, num_cw=10):
        super().__init__(name, length, seed, tokenizer)
        self.freq_cw, self.freq_ucw = (freq_cw, freq_ucw) if length >= 4096 else (6, 1)
        self.num_cw = num_cw
        self.words = sorted(set(word_list("nouns")) | set(word_list("adjectives")) | set(word_list("verbs")))
        if len(self.words) <= num_cw + 1:
            raise ValueError(f"the word list has {len(self.words)} words, too few for {num_cw} common words")

    def build(self, index: int, n: int) -> RulerSample:
        order = self.rng(index).sample(self.words, len(self.words))  # a permutation: prefix-consistent in n
        available = len(order) - self.num_cw
        scale = -(-n // available)  # > 1 only when the length needs more distinct words than the list has
        distinct = -(-n // scale)
        common, uncommon = order[: self.num_cw], order[self.num_cw : self.num_cw + distinct]
        entries = common * (self.freq_cw * scale) + uncommon * (self.freq_ucw * scale)
        self.rng(index, "order", n).shuffle(entries)
        context = " ".join(f"{i + 1}. {w}" for i, w in enumerate(entries))
        return RulerSample(
            input=CWE_TEMPLATE.format(num_cw=self.num_cw),
            context=context,
            outputs=list(common),
            answer_prefix=CWE_ANSWER_PREFIX.format(num_cw=self.num_cw),
            extra={"frequency_scale": scale},
        )


def zeta(alpha: float, terms: int = 10_000) -> float:
    """Riemann zeta for alpha > 1: a partial sum plus the Euler-Maclaurin tail (no scipy needed)."""
    if alpha <= 1:
        raise ValueError("zeta diverges for alpha <= 1")
    partial = math.fsum(k**-alpha for k in range(1, terms))
    n = float(terms)
    return partial + n ** (1 - alpha) / (alpha - 1) + 0.5 * n**-alpha + alpha * n ** (-alpha - 1) / 12


class FrequentWordsTask(UnitTask):
    """Units: words of coded text."""

    tokens_to_generate = 50
    guess_tokens_per_unit = 2.0
    min_units = 100  # the 4th-ranked word needs a count of at least 1

    def __init__(self, name: str, length: int, seed: int, tokenizer, alpha=2.0, coded_wordlen=6, vocab_size=-1):
        super().__init__(name, length, seed, tokenizer)
        self.alpha, self.wordlen = alpha, coded_wordlen
        self.vocab_size = length // 50 if vocab_size <= 0 else vocab_size
        if self.vocab_size < 5:
            raise ValueError(f"fwe needs a vocabulary of at least 5 words, got {self.vocab_size}")
        self.zeta = zeta(alpha)

    def _vocab(self, rng: random.Random) -> list[str]:
        vocab: set[str] = set()
        while len(vocab) < self.vocab_size:
            vocab.add("".join(rng.choices(string.ascii_lowercase, k=self.wordlen)))
        ordered = sorted(vocab)
        rng.shuffle(ordered)
        ordered[0] = "..."  # the top-ranked word is noise
        return ordered

    def build(self, index: int, n: int) -> RulerSample:
        vocab = self._vocab(self.rng(index))
        words: list[str] = []
        for rank, word in enumerate(vocab, 1):
            count = int(n * rank**-self.alpha / self.zeta)
            if count == 0:
                break  # counts only decrease with rank
            words += [word] * count
        self.rng(index, "order", n).shuffle(words)
        return RulerSample(
            input=FWE_TEMPLATE, context=" ".join(words), outputs=vocab[1:4], answer_prefix=FWE_ANSWER_PREFIX
        )
