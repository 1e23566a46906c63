"""The reader of the CPU replication: its tokenizer and its ~1M-parameter Qwen2 configuration.

The tokenizer is a byte-level BPE (``recurrent.models.train_bpe_tokenizer``, the tiny model's recipe and
Qwen-style chat template) trained on the task's own text: the paper's two prompts, the chat template, filler,
needles and questions of every split. Vocabulary 1024 (256 bytes, 3 special tokens, the rest merges, so the
prompts' and keys' words are whole tokens), then the 100 two-digit strings "00".."99" added as tokens: a 4-digit
number is two tokens, "7445" -> "74" "45".

Why pairs (docs/replication_cpu_notebook.md, "Numbers a small reader can copy"): with one token per digit a
~1M-parameter reader copies a number by finding the digit it just wrote in the source and emitting the next one, and a
number that repeats a digit (half of all 4-digit numbers) gives it two places to continue from: nearly all of the
one-digit reader's copy errors were there. With pairs the same ambiguity is left only for numbers whose two halves are
equal (1 in 100). This is a property of a tiny reader; the paper's 7B copies digits fine.

Pairs are *added tokens*, not a pre-tokenizer rule, on purpose: the reader's folder loads through
``AutoTokenizer`` as transformers' Qwen2 tokenizer, which replaces a saved pre-tokenizer with its own (one token
per digit) but keeps added tokens, so only added tokens encode the same in memory and from the folder
(``tests/experiments/needle/test_reader_tokenizer.py``).

The model: Qwen2, hidden 128, 4 layers, 8 attention heads / 4 KV heads, intermediate 512, tied embeddings
(~1.1M parameters with this vocabulary), the size measured in docs/replication_probes.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.needle.needle import ADJ, NOUN, corpus_lines
from experiments.small_reader import reader_config  # noqa: F401  (the needle reader's configuration)
from recurrent.impls.memory import FINAL_TEMPLATES, MEMORY_TEMPLATE, NO_MEMORY
from recurrent.models import train_bpe_tokenizer

VOCAB_SIZE = 1024
DIGIT_PAIRS = [f"{i:02d}" for i in range(100)]


# The tokenizer's training text: the task's, or that plus the digit pairs and the keys, repeated (the default since
# recipe 4: its readers write the needle in long documents; docs/replication_cpu_notebook.md, "One setting at a
# time"). Either way every word of the task is one token; the extra text changes the order of the merges and so the
# tokens' ids.
CORPORA = ("task", "keys")
DEFAULT_CORPUS = "keys"


def tokenizer_corpus(seed: int = 0, corpus: str = DEFAULT_CORPUS) -> list[str]:
    """The tokenizer's training text: the task's lines plus the prompts (repeated so their words merge); ``keys``:
    also the 100 digit pairs 400 times and, 100 times each, the keys " ADJ-NOUN" of every adjective with the first
    three nouns and every noun with the first three adjectives."""
    if corpus not in CORPORA:
        raise ValueError(f"unknown tokenizer corpus {corpus!r}; one of {CORPORA}")
    prompts = [
        MEMORY_TEMPLATE,
        *FINAL_TEMPLATES.values(),
        NO_MEMORY,
        "<|im_start|>system\nYou are a helpful assistant.",
    ]
    lines = corpus_lines(seed) + prompts * 200
    if corpus == "keys":
        keys = [f" {a}-{n}" for a in ADJ for n in NOUN[:3]] + [f" {a}-{n}" for n in NOUN for a in ADJ[:3]]
        lines += DIGIT_PAIRS * 400 + keys * 100
    return lines


def build_tokenizer(seed: int = 0, corpus: str = DEFAULT_CORPUS) -> Any:
    """The reader tokenizer (deterministic for a seed and corpus): BPE with single digits, then the digit pairs
    added."""
    tokenizer = train_bpe_tokenizer(tokenizer_corpus(seed, corpus), vocab_size=VOCAB_SIZE, individual_digits=True)
    tokenizer.add_tokens(DIGIT_PAIRS)
    return tokenizer


def load_or_build_tokenizer(folder: str | Path | None = None) -> Any:
    """The tokenizer saved in ``folder`` (a reader model folder), else a freshly built one."""
    if folder is None:
        return build_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)
