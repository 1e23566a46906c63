"""Aggregation tasks: common words extraction (``cwe``) and frequent words extraction (``fwe``).

``cwe``, as RULER defines it at every length: a numbered list where ``num_cw`` common words appear ``freq_cw``
times and the others ``freq_ucw`` times (30 and 3; 6 and 1 below 4K tokens); the answer is the common words.
The words come from the official generator's sources: the noun, adjective and verb lists shipped in the
``wonderwords`` package (~8,700 distinct words), and, when a length needs more distinct words than those
(around 128K tokens and beyond), the ~234,000 lower-case words of the ``web2`` list of the ``english-words``
package. A one-shot example comes first, as in RULER: a short list (40 words, 10 and 3 repeats; 20 words, 3 and
1 below 4K tokens) with its question and answer. In MemAgent's layout the example is the start of the context
and the question is the ``input``.

``fwe``: coded words of six random letters with Zipf-like counts ``num_words * k**-alpha / zeta(alpha)``
(vocabulary ``length // 50``); the most frequent word is replaced by ``...`` and the answer is the next three.
"""

from __future__ import annotations

import functools
import math
import random
import string
from importlib import resources

from taskutils.memory_data.ruler.common import RulerSample, UnitTask

CWE_TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
    "that appear most often. Question: What are the {num_cw} most common words in the above list?"
)
CWE_QUESTION = "Question: What are the {num_cw} most common words in the above list?"
CWE_ANSWER_PREFIX = " Answer: The top {num_cw} words that appear most often in the list are:"
FWE_TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words. Question: Do not provide any explanation. Please ignore the dots '....'. What are the "
    "three most frequently appeared words in the above coded text?"
)
FWE_ANSWER_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"


@functools.lru_cache(maxsize=1)
def wonderwords_words() -> tuple[str, ...]:
    """The official generator's words: wonderwords' nouns, adjectives and verbs, as a sorted set."""
    assets = resources.files("wonderwords.assets")
    words: set[str] = set()
    for name in ("nounlist.txt", "adjectivelist.txt", "verblist.txt"):
        words.update(w.strip() for w in assets.joinpath(name).read_text().splitlines() if w.strip())
    return tuple(sorted(words))


@functools.lru_cache(maxsize=1)
def english_words() -> tuple[str, ...]:
    """The long-length source: the lower-case ``web2`` words of the english-words package, as a sorted set."""
    from english_words import get_english_words_set

    return tuple(sorted(get_english_words_set(["web2"], lower=True)))


def numbered(words: list[str]) -> str:
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


class CommonWordsTask(UnitTask):
    """Units: distinct uncommon words of the list."""

    tokens_to_generate = 120
    guess_tokens_per_unit = 12.0

    def __init__(self, name: str, length: int, seed: int, tokenizer, freq_cw=30, freq_ucw=3, num_cw=10):
        super().__init__(name, length, seed, tokenizer)
        short = length < 4096
        self.freq_cw, self.freq_ucw = (6, 1) if short else (freq_cw, freq_ucw)
        self.example_words, self.example_freqs = (20, (3, 1)) if short else (40, (10, 3))
        self.num_cw = num_cw
        self.words = wonderwords_words()
        if self._too_short_at_most():  # the length needs more distinct words than wonderwords has
            self.words = english_words()

    def _too_short_at_most(self) -> bool:
        """Whether a sample using every word of ``self.words`` still falls short of the length."""
        return self.count(self.build(-2, self.max_units())) < self.length

    def max_units(self) -> int:
        return len(self.words) - self.num_cw - self.example_words

    def build(self, index: int, n: int) -> RulerSample:
        # One permutation of the whole word list per sample. The list's words are its first num_cw + n, so a
        # larger n adds words and keeps the ones before (the calibration relies on it); the example's are its
        # last ones, so no example word is also a word of the list.
        order = self.rng(index).sample(self.words, len(self.words))
        common, uncommon = order[: self.num_cw], order[self.num_cw : self.num_cw + n]
        entries = common * self.freq_cw + uncommon * self.freq_ucw
        self.rng(index, "order", n).shuffle(entries)
        example_common, example_rest = order[-self.num_cw :], order[-self.example_words : -self.num_cw]
        example = example_common * self.example_freqs[0] + example_rest * self.example_freqs[1]
        self.rng(index, "example").shuffle(example)
        question = CWE_QUESTION.format(num_cw=self.num_cw)
        shown = CWE_ANSWER_PREFIX.format(num_cw=self.num_cw) + " " + numbered(example_common)
        context = f"{numbered(example)}\n{question}{shown}\n\n{numbered(entries)}"
        return RulerSample(
            input=CWE_TEMPLATE.format(num_cw=self.num_cw),
            context=context,
            outputs=list(common),
            answer_prefix=CWE_ANSWER_PREFIX.format(num_cw=self.num_cw),
            extra={"word_source": "wonderwords" if self.words is wonderwords_words() else "english-words web2"},
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
