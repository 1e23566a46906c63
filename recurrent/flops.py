"""FLOP of a decoder-only transformer (Qwen2-style: grouped-query attention, SwiGLU MLP) from its config.

One definition for the cost model of a training step (``verl_ext/cost.py``) and the GPU throughput script
(``scripts/bench_update_kernels.py``, which runs where only torch and transformers are installed: this module
imports nothing else). What is counted (docs/cluster.md, "What a step costs"):

- the matrix multiplications a token goes through: per layer the q, k, v and o projections and the MLP's gate, up
  and down projections, then the output head over the vocabulary (verl's engine computes logits at every position,
  prompt included). 2 FLOP per weight per token. Embedding lookups, norms, biases, rotary embeddings, softmax and
  the loss are left out (well under 1% at the sizes planned here);
- attention: per layer and per (query, key) pair, 2 x heads x head_dim for the scores and as much for the weighted
  sum. A causal row of L tokens has L(L+1)/2 pairs when the kernel skips the masked half (flash-attn on packed rows;
  sdpa on a row with no padding, where transformers passes ``is_causal``); a padded micro-batch under sdpa carries
  an explicit mask, and the kernel computes every pair of the padded square, L_max^2 per row;
- a backward pass is twice its forward; gradient checkpointing recomputes the forward once more.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BACKWARD_FACTOR = 2  # a backward pass: gradients of the activations and of the weights, each a forward's worth


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder that decide its FLOP and bytes."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool  # the output head shares the embedding's weights (fewer parameters, the same FLOP)

    @classmethod
    def from_config(cls, config: dict[str, Any], name: str) -> ModelShape:
        """From a Hugging Face ``config.json`` as a dict (``head_dim`` defaults to hidden / heads)."""
        missing = [
            key
            for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
            if key not in config
        ]
        if missing:
            raise ValueError(f"{name}: the model config has no {', '.join(missing)}")
        heads = int(config["num_attention_heads"])
        return cls(
            name=name,
            hidden=int(config["hidden_size"]),
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
            intermediate=int(config["intermediate_size"]),
            vocab=int(config["vocab_size"]),
            tied=bool(config.get("tie_word_embeddings", False)),
        )

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelShape:
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json in {folder}")
        return cls.from_config(json.loads(path.read_text()), Path(folder).name)

    @property
    def layer_weights(self) -> int:
        """Weights of one layer's matrix multiplications (attention projections and the SwiGLU MLP)."""
        q_and_o = 2 * self.hidden * self.heads * self.head_dim
        k_and_v = 2 * self.hidden * self.kv_heads * self.head_dim
        return q_and_o + k_and_v + 3 * self.hidden * self.intermediate

    @property
    def matmul_weights(self) -> int:
        """Weights every token is multiplied by: every layer's, then the output head's."""
        return self.layers * self.layer_weights + self.hidden * self.vocab

    @property
    def parameters(self) -> int:
        """All parameters: the matrices, the embedding (once more unless tied), q/k/v biases and the norms."""
        embedding = 0 if self.tied else self.hidden * self.vocab
        biases = (self.heads + 2 * self.kv_heads) * self.head_dim
        norms = 2 * self.hidden
        return self.matmul_weights + embedding + self.layers * (biases + norms) + self.hidden

    def linear_flops(self, tokens: int) -> int:
        """Forward FLOP of the matrix multiplications over ``tokens`` token positions."""
        return 2 * self.matmul_weights * tokens

    def attention_flops(self, pairs: int) -> int:
        """Forward FLOP of attention over ``pairs`` (query, key) pairs in every layer: scores and weighted sum."""
        return 4 * self.layers * self.heads * self.head_dim * pairs

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Bytes of the key/value cache one token holds (every layer's k and v)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def causal_pairs(length: int) -> int:
    """(query, key) pairs of a causal row: every token attends to itself and the tokens before it."""
    return length * (length + 1) // 2


@dataclass(frozen=True)
class ForwardCount:
    """One forward pass over a micro-batch: the token positions computed (padding included) and its FLOP."""

    tokens: int  # real tokens
    computed_tokens: int  # positions the kernels run over: rows x longest row when padded
    flops: int

    def __add__(self, other: ForwardCount) -> ForwardCount:
        return ForwardCount(
            self.tokens + other.tokens, self.computed_tokens + other.computed_tokens, self.flops + other.flops
        )


NO_WORK = ForwardCount(0, 0, 0)


def forward_count(shape: ModelShape, lengths: Sequence[int], packed: bool) -> ForwardCount:
    """The forward pass over one micro-batch of rows of these lengths.

    ``packed``: the rows are concatenated into one (flash-attn's varlen kernels keep them apart): every real token
    computed once, causal pairs per row. Padded (sdpa, ``use_remove_padding=false``): every row is as long as the
    micro-batch's longest; with rows of different lengths the kernel runs every pair of the padded square, with one
    length (no padding) only the causal half."""
    if not lengths:
        return NO_WORK
    tokens = sum(lengths)
    if packed:
        computed, pairs = tokens, sum(causal_pairs(n) for n in lengths)
    else:
        longest = max(lengths)
        computed = len(lengths) * longest
        same = all(n == longest for n in lengths)
        pairs = len(lengths) * (causal_pairs(longest) if same else longest * longest)
    return ForwardCount(tokens, computed, shape.linear_flops(computed) + shape.attention_flops(pairs))


# The published config.json sizes of the models the run configs name (no download needed to plan a run).
PUBLISHED_SHAPES = {
    "Qwen/Qwen2.5-0.5B-Instruct": ModelShape("Qwen2.5-0.5B-Instruct", 896, 24, 14, 2, 64, 4864, 151936, True),
    "Qwen/Qwen2.5-7B-Instruct": ModelShape("Qwen2.5-7B-Instruct", 3584, 28, 28, 4, 128, 18944, 152064, False),
    "Qwen/Qwen2.5-14B-Instruct": ModelShape("Qwen2.5-14B-Instruct", 5120, 48, 40, 8, 128, 13824, 152064, False),
}


# Dense bf16 peak (no sparsity) and memory bandwidth of the GPUs the cost model knows, from the vendors' data sheets
# (the SXM parts).
GPU_SPECS = {
    "h100": ("H100 SXM", 989e12, 3.35e12),
    "h200": ("H200 SXM", 989e12, 4.8e12),
    "a100": ("A100 SXM 80GB", 312e12, 2.04e12),
}
