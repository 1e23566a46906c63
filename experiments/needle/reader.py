"""The reader of the CPU replication: its tokenizer and its ~1M-parameter Qwen2 configuration.

The tokenizer is a byte-level BPE (``recurrent.models.train_bpe_tokenizer``, the tiny model's recipe and
Qwen-style chat template) trained on the task's own text: the paper's two prompts, the chat template, filler,
needles and questions of every split. Vocabulary 512 (256 bytes, 3 special tokens, the rest merges); every digit
is its own token. A memory turn of the paper's prompt with a 64-token chunk and a 32-token memory is ~230 tokens.

The model: Qwen2, hidden 128, 4 layers, 8 attention heads / 4 KV heads, intermediate 512, tied embeddings
(1.03M parameters with this vocabulary), the size measured in docs/replication_probes.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.small_reader import reader_config  # noqa: F401  (the needle reader's configuration)
from recurrent.agents.memory import FINAL_TEMPLATES, MEMORY_TEMPLATE, NO_MEMORY
from recurrent.models import train_bpe_tokenizer

VOCAB_SIZE = 512


def tokenizer_corpus(seed: int = 0) -> list[str]:
    """The tokenizer's training text: the task's lines plus the prompts (repeated so their words merge)."""
    from experiments.needle.needle import corpus_lines

    prompts = [
        MEMORY_TEMPLATE,
        *FINAL_TEMPLATES.values(),
        NO_MEMORY,
        "<|im_start|>system\nYou are a helpful assistant.",
    ]
    return corpus_lines(seed) + prompts * 200


def build_tokenizer(seed: int = 0) -> Any:
    """The reader tokenizer (deterministic for a seed)."""
    return train_bpe_tokenizer(tokenizer_corpus(seed), vocab_size=VOCAB_SIZE, individual_digits=True)


def load_or_build_tokenizer(folder: str | Path | None = None) -> Any:
    """The tokenizer saved in ``folder`` (a reader model folder), else a freshly built one."""
    if folder is None:
        return build_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)
