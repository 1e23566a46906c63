"""What the CPU experiments' small readers share: the Qwen2 configuration of a ~1M-parameter reader and the
synthetic copy rows that teach it copying before it learns its task (experiments/needle, experiments/calculator)."""

from __future__ import annotations

import random
from typing import Any

Row = tuple[list[int], list[int]]  # prompt ids, supervised response ids


def reader_config(
    tokenizer: Any,
    hidden: int = 128,
    layers: int = 4,
    heads: int = 8,
    kv_heads: int = 4,
    max_positions: int = 4096,
) -> Any:
    """The Qwen2 configuration of a reader for ``tokenizer`` (intermediate size 4 x hidden, tied embeddings)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )


def copy_rows(
    tokenizer: Any, rng: random.Random, count: int, width: int = 64, span: tuple[int, int] = (24, 30)
) -> list[Row]:
    """Synthetic copy rows: ``noise { x1..xk } noise {`` -> ``x1..xk }`` over random ordinary tokens. The repeat
    can only be copied (pure induction), and half the row is supervised: the dense signal that forms copying in a
    small transformer in a few hundred steps, a mechanism the task's own rows teach slowly."""
    first = len(tokenizer.all_special_ids)  # the special tokens come first in the vocabulary
    vocab = len(tokenizer)
    open_id, close_id = tokenizer.convert_tokens_to_ids("{"), tokenizer.convert_tokens_to_ids("}")
    out: list[Row] = []
    for _ in range(count):
        k = rng.randint(*span)
        body = [rng.randrange(first, vocab) for _ in range(k)]
        noise = max(0, width - 2 * (k + 2))
        before = rng.randint(0, noise)
        prompt = [rng.randrange(first, vocab) for _ in range(before)] + [open_id, *body, close_id]
        prompt += [rng.randrange(first, vocab) for _ in range(noise - before)] + [open_id]
        out.append((prompt, [*body, close_id]))
    return out
