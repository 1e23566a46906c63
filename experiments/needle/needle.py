"""The needle task of the CPU replication, with train / validation / test splits that share no needle.

A document is filler sentences ("The baker painted a tall tree after lunch.") holding one needle
"The special magic number for KEY is NNNN." The question asks for KEY's number; the answer is NNNN.

Disjoint splits. KEY is two words joined by a hyphen, ``ADJ[a]-NOUN[n]``; NNNN is 1000-9999. A key belongs to
split ``(a + n) % 3`` (0 train, 1 validation, 2 test); the 9,000 numbers are dealt to the three splits by a
seeded shuffle (:func:`split_numbers`), so no key and no number of one split occurs in another, and no needle
sentence is shared. Numbers are dealt at random rather than by ``NNNN % 3`` because the reader reads a number as
two two-digit tokens (:mod:`experiments.needle.reader`) and ``(100 a + b) % 3 = (a + b) % 3``: an arithmetic rule
over the two tokens would tell a number's split, a shortcut a reader could learn instead of copying. The words
themselves are shared (a key of the test split is a new *pair* of known words; every two-digit token occurs in
training numbers), so the reader has seen every token in training and a test needle is new only as a whole.

The choosing task (``--distractors K``, ``--task choose``): the same documents with K more needles of other keys
of the split (other numbers too), each whole inside a chunk; the question asks for one of them. The memory the
agent writes holds two needle sentences at most (32 tokens), so from K = 2 on, a reader that keeps needles as it
meets them loses the asked one when the others come later: it must choose (RULER's multi-key needle, in the
small). ``needle_chunk`` is the asked needle's chunk; the survival analysis follows the asked needle.

Exact length. The context of an ``N``-chunk document has between ``64 (N - 1) + 1`` and ``64 N`` tokens of the
reader tokenizer (:mod:`experiments.needle.reader`), so ``MemoryConfig(chunk_size=64)`` splits it into
exactly ``N`` chunks; the needle lies whole inside one chunk (its decoded text contains the needle sentence) and
its chunk is drawn uniformly.

The files of a run: ``python -m experiments.needle.data`` (:mod:`experiments.needle.data`).
"""

from __future__ import annotations

import functools
import os
import random
import re
from typing import Any

import numpy as np

from recurrent.tokens import encode_long

SPLITS = ("train", "validation", "test")
DATA_SOURCE = "replication_needle"
CHUNK_SIZE = 64

ADJ = (
    "brave calm dark eager fancy gentle happy icy jolly kind lazy mighty noisy odd proud quick rapid shy "
    "silly tall vast warm young zany bold bright cold dry early fair"
).split()
NOUN = (
    "otter heron falcon tiger lemon river castle garden pencil rocket violin wizard anchor badger candle "
    "dragon engine forest glacier harbor island jungle kettle ladder meadow orchard planet"
).split()
SUBJ = (
    "The farmer|The old man|A young girl|The teacher|My neighbor|The doctor|A small dog|The captain|"
    "The baker|Her brother|The children|The mayor|A tired student|The pilot|Our guide"
).split("|")
VERB = (
    "walked to|looked at|painted|carried|talked about|found|visited|cleaned|bought|forgot|repaired|"
    "watched|opened|remembered|described"
).split("|")
OBJ = (
    "the red barn|a quiet lake|the long road|an empty box|the wooden table|a tall tree|the city market|"
    "the blue house|a broken clock|the stone bridge|a warm coat|the green field|an old map|the school|"
    "a heavy bag|the morning train"
).split("|")
TAIL = (
    "|in the morning|after lunch|before the rain|with great care|for a long time|on Sunday|near the hill|"
    "without a word|again and again|at noon"
).split("|")

NEEDLE = "The special magic number for {key} is {value}."
QUESTION = "What is the special magic number for {key} mentioned in the provided text?"
NEEDLE_RE = re.compile(r"The special magic number for (\S+) is (\d{4})\.")
NUMBER_RE = re.compile(r"\d{4}")  # a needle's number, in a sentence or bare
SENTENCE_RE = re.compile(r"[A-Z][^.]*\.")


def names_a_needle(memory: str) -> bool:
    """A memory names a needle: it mentions a magic number or holds a 4-digit number (whole or blended)."""
    return "magic number" in memory or bool(NUMBER_RE.search(memory))


def split_id(split: str) -> int:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; one of {SPLITS}")
    return SPLITS.index(split)


def split_keys(split: str) -> list[str]:
    """The keys of a split: ``ADJ[a]-NOUN[n]`` with ``(a + n) % 3`` the split's id."""
    sid = split_id(split)
    return [f"{a}-{n}" for i, a in enumerate(ADJ) for j, n in enumerate(NOUN) if (i + j) % 3 == sid]


NUMBER_DEAL_SEED = "needle-numbers"  # the shuffle that deals the 4-digit numbers to the splits
# How the numbers go to the splits: dealt by the seeded shuffle (the default), or by ``NNNN % 3`` (the rule before
# the two-digit reader; docs/replication_cpu_notebook.md, "The cause, measured"). An experiment's switch, read from
# the environment so that every stage of a run (data, warm start) deals the same way.
NUMBER_RULES = ("dealt", "mod3")
NUMBERS_ENV = "NEEDLE_NUMBERS"


def number_rule() -> str:
    """The numbers' split rule of this process: ``$NEEDLE_NUMBERS``, default ``dealt``."""
    rule = os.environ.get(NUMBERS_ENV, "dealt")
    if rule not in NUMBER_RULES:
        raise ValueError(f"{NUMBERS_ENV}={rule!r}: one of {NUMBER_RULES}")
    return rule


@functools.cache
def _split_numbers(rule: str) -> tuple[tuple[int, ...], ...]:
    numbers = list(range(1000, 10000))
    if rule == "mod3":
        return tuple(tuple(v for v in numbers if v % len(SPLITS) == i) for i in range(len(SPLITS)))
    random.Random(NUMBER_DEAL_SEED).shuffle(numbers)
    third = len(numbers) // len(SPLITS)
    return tuple(tuple(sorted(numbers[i * third : (i + 1) * third])) for i in range(len(SPLITS)))


def split_numbers(split: str) -> list[int]:
    """The numbers of a split (ascending): its third of the 4-digit numbers, dealt by a seeded shuffle
    (:func:`number_rule` ``mod3``: those ``v`` with ``v % 3`` the split's id)."""
    return list(_split_numbers(number_rule())[split_id(split)])


def filler_sentence(rng: random.Random) -> str:
    tail = rng.choice(TAIL)
    return f"{rng.choice(SUBJ)} {rng.choice(VERB)} {rng.choice(OBJ)}{' ' + tail if tail else ''}."


def corpus_lines(seed: int = 0, count: int = 3000) -> list[str]:
    """Text of the task for training the reader's tokenizer: filler, needles and questions of every split."""
    rng = random.Random(f"corpus-{seed}")
    keys = [k for s in SPLITS for k in split_keys(s)]
    lines = []
    for _ in range(count):
        key, value = rng.choice(keys), rng.randint(1000, 9999)
        lines.append(" ".join(filler_sentence(rng) for _ in range(3)))
        lines.append(NEEDLE.format(key=key, value=value) + " " + QUESTION.format(key=key))
        lines.append(f"\\boxed{{{value}}}")
    return lines


def chunk_texts(context_ids: np.ndarray, tokenizer: Any, chunk_size: int = CHUNK_SIZE) -> list[str]:
    """The decoded chunks as the memory agent shows them (token slices of the context, decoded)."""
    return [
        tokenizer.decode(context_ids[i : i + chunk_size], skip_special_tokens=True)
        for i in range(0, len(context_ids), chunk_size)
    ]


class SentenceTokens:
    """Token ids of the task's sentences, each encoded once: first in a text, or after a space. The reader's
    byte-level BPE (and the Qwen2 tokenizer that loads its folder) never merges across the space between two
    sentences (one ends with ".", the next starts with a capital letter), so a text of joined sentences encodes as
    the concatenation of its sentences' ids, and its length and the place of each sentence follow by addition. The
    generators below use this to stay linear in the document's length; each checks it on the finished document."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._ids: dict[tuple[str, bool], list[int]] = {}

    def ids(self, sentence: str, first: bool = False) -> list[int]:
        key = (sentence, first)
        if key not in self._ids:
            self._ids[key] = self.tokenizer.encode(sentence if first else " " + sentence, add_special_tokens=False)
        return self._ids[key]

    def count(self, sentence: str, first: bool = False) -> int:
        return len(self.ids(sentence, first))

    def fill(self, rng: random.Random, head: list[str], hi: int) -> list[str]:
        """Filler sentences drawn one by one while ``head`` and those drawn so far fit in ``hi`` tokens; the
        sentence that does not fit is drawn (the random stream moves past it) and left out."""
        total = self.count(head[0], first=True) + sum(self.count(s) for s in head[1:]) if head else 0
        sentences: list[str] = []
        while True:
            sentence = filler_sentence(rng)
            total += self.count(sentence, first=not head and not sentences)
            if total > hi:
                return sentences
            sentences.append(sentence)

    def check(self, parts: list[str], ids: np.ndarray) -> None:
        """That ``parts`` joined by spaces encoded as ``ids``, the concatenation of their own ids."""
        joined = [t for i, part in enumerate(parts) for t in self.ids(part, first=i == 0)]
        if ids.tolist() != joined:
            raise RuntimeError("the tokenizer merges tokens across sentences: the generator's counts do not hold")


def make_document(
    rng: random.Random, tokenizer: Any, n_chunks: int, split: str, chunk_size: int = CHUNK_SIZE
) -> dict[str, Any]:
    """One document of exactly ``n_chunks`` chunks of ``chunk_size`` reader tokens, with one needle of ``split``
    lying whole inside a chunk drawn uniformly (see the module docstring). Filler is drawn to at most the last
    chunk's end (needle included), then the needle tried at the places between sentences in a shuffled order until
    it lies whole in the drawn chunk. Each sentence is encoded once (:class:`SentenceTokens`), so the time is linear
    in the length (docs/replication_cpu_notebook.md, "The documents' generator")."""
    if n_chunks < 1:
        raise ValueError("n_chunks must be >= 1")
    key, value = rng.choice(split_keys(split)), str(rng.choice(split_numbers(split)))
    needle = NEEDLE.format(key=key, value=value)
    lo, hi = chunk_size * (n_chunks - 1) + 1, chunk_size * n_chunks
    tokens = SentenceTokens(tokenizer)
    for _attempt in range(100):
        sentences = tokens.fill(rng, [needle], hi)
        target = rng.randrange(n_chunks)
        positions = list(range(len(sentences) + 1))
        rng.shuffle(positions)
        # The needle after sentence pos - 1 starts where sentence pos would (starts[pos]); first, it starts at 0 and
        # the first filler sentence, no longer first, takes its spaced form.
        starts = [0]
        for i, sentence in enumerate(sentences):
            starts.append(starts[-1] + tokens.count(sentence, first=i == 0))
        shift = tokens.count(sentences[0]) - tokens.count(sentences[0], first=True) if sentences else 0
        for pos in positions:
            start = starts[pos] if pos else 0
            end = start + tokens.count(needle, first=not pos)
            length = starts[-1] + (end - start) + (0 if pos else shift)
            if not lo <= length <= hi or not target * chunk_size <= start < end <= (target + 1) * chunk_size:
                continue
            parts = [*sentences[:pos], needle, *sentences[pos:]]
            ids = encode_long(" ".join(parts), tokenizer)
            tokens.check(parts, ids)
            chunk = tokenizer.decode(ids[target * chunk_size : (target + 1) * chunk_size], skip_special_tokens=True)
            if needle in chunk:
                return {
                    "key": key,
                    "value": value,
                    "needle": needle,
                    "needle_chunk": target,
                    "num_chunks": n_chunks,
                    "question": QUESTION.format(key=key),
                    "context": " ".join(parts),
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
    sentence_tokens = SentenceTokens(tokenizer)
    for _fill in range(20):
        sentences = sentence_tokens.fill(rng, needles, hi)
        for _attempt in range(20):
            # The distractors at random places; then the asked needle at a place whose first token falls in the
            # target chunk by the sentences' token counts (checked below on the real encoding).
            parts = list(sentences)
            for needle in needles[1:]:
                parts.insert(rng.randint(0, len(parts)), needle)
            starts, offset = [], 0
            for part in parts:
                starts.append(offset)
                offset += sentence_tokens.count(part)  # what a sentence adds after another
            starts.append(offset)
            room = chunk_size - sentence_tokens.count(needles[0])
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
    sentences = SentenceTokens(tokenizer).fill(rng, [], hi)
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


def make_decoy_start(
    rng: random.Random, tokenizer: Any, n_chunks: int, split: str, chunk_size: int = CHUNK_SIZE
) -> dict[str, Any]:
    """An episode that starts from a wrong memory: a document of :func:`make_document` whose memory already holds
    the needle sentence of the asked key with another number (as a reader that invented a number over earlier
    filler would hold it). The answer needs the memory overwritten when the needle's chunk is read."""
    doc = make_document(rng, tokenizer, n_chunks, split, chunk_size)
    numbers = [n for n in split_numbers(split) if str(n) != doc["value"]]
    return {**doc, "memory": NEEDLE.format(key=doc["key"], value=rng.choice(numbers))}


def make_documents(
    tokenizer: Any,
    split: str,
    count: int,
    chunks: tuple[int, ...] | list[int],
    seed: int = 0,
    late_start: float = 0.0,
    decoy_start: float = 0.0,
    distractors: int = 0,
) -> list[dict[str, Any]]:
    """``count`` documents of ``split``; the i-th has ``chunks[i % len(chunks)]`` chunks. With ``distractors``, the
    choosing task's documents (:func:`make_choice_document`; no late or decoy starts). With ``late_start`` and
    ``decoy_start``, those shares of them (drawn independently, document by document) are episodes that start late
    (:func:`make_late_start`) or from a wrong memory (:func:`make_decoy_start`)."""
    for name, share in (("late_start", late_start), ("decoy_start", decoy_start)):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{name} must be a share in [0, 1], got {share}")
    if late_start + decoy_start > 1.0:
        raise ValueError(f"late_start + decoy_start must be at most 1, got {late_start} + {decoy_start}")
    rng = random.Random(f"{seed}-{split}")
    if distractors:
        if late_start or decoy_start:
            raise ValueError("the choosing task (distractors) has no late or decoy starts")
        return [make_choice_document(rng, tokenizer, chunks[i % len(chunks)], split, distractors) for i in range(count)]
    if not late_start and not decoy_start:  # the stream of random draws of the paper's documents, unchanged
        return [make_document(rng, tokenizer, chunks[i % len(chunks)], split) for i in range(count)]
    late_rng = random.Random(f"{seed}-{split}-late")
    docs = []
    for i in range(count):
        n = chunks[i % len(chunks)]
        draw = late_rng.random()
        if draw < late_start:
            docs.append(make_late_start(rng, tokenizer, n, split))
        elif draw < late_start + decoy_start:
            docs.append(make_decoy_start(rng, tokenizer, n, split))
        else:
            docs.append(make_document(rng, tokenizer, n, split))
    return docs


def verl_row(doc: dict[str, Any], split: str, index: int) -> dict[str, Any]:
    """A verl RL row (``experiments/tiny/data.py`` columns) of one document."""
    extra = {"distractor_chunks": [d["chunk"] for d in doc["distractors"]]} if "distractors" in doc else {}
    return {
        "prompt": [{"role": "user", "content": doc["question"]}],
        "context": doc["context"],
        # The memory the episode starts from ("": the paper's "No previous memory"; read only when the agent's
        # recurrent.config.memory_key names this column).
        "memory": doc.get("memory", ""),
        "data_source": DATA_SOURCE,
        "reward_model": {"style": "rule", "ground_truth": doc["value"]},
        "extra_info": {
            "split": split,
            "index": index,
            "num_chunks": doc["num_chunks"],
            "needle_chunk": doc["needle_chunk"],
            "key": doc["key"],
            **extra,
        },
    }


def eval_item(doc: dict[str, Any], index: int) -> dict[str, Any]:
    """An eval-set item (``taskutils.memory_eval.evalsets``), ``index`` first; ``needle_chunk`` (the harness ignores
    it) is for the survival analysis, :mod:`experiments.needle.survival`."""
    return {
        "index": index,
        "input": doc["question"],
        "context": doc["context"],
        "answers": [doc["value"]],
        "needle_chunk": doc["needle_chunk"],
    }
