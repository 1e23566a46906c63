"""FLOP and parameter counts of a decoder (recurrent/flops.py), against counts made by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recurrent.flops import PUBLISHED_SHAPES, ModelShape, causal_pairs, forward_count

# hidden 8, 2 layers, 2 heads of 4, 1 KV head, intermediate 16, vocabulary 10.
TOY = ModelShape("toy", hidden=8, layers=2, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=10, tied=True)


def test_weights_and_parameters_by_hand():
    # One layer: q and o 8 x (2 x 4) each = 128, k and v 8 x (1 x 4) each = 64, gate/up/down 3 x 8 x 16 = 384 -> 576.
    assert TOY.layer_weights == 576
    # Every token: 2 layers x 576 + the output head 8 x 10 = 1232.
    assert TOY.matmul_weights == 1232
    # Parameters: 1232, the tied embedding adds nothing, q/k/v biases (2 + 1 + 1) x 4 = 16 and two norms of 8 per
    # layer (2 x 32 = 64), the final norm 8: 1304; untied, the embedding's 80 more.
    assert TOY.parameters == 1304
    assert ModelShape(**{**TOY.__dict__, "tied": False}).parameters == 1384
    # The key/value cache: k and v, 2 layers, 1 KV head of 4, 2 bytes: 32 bytes a token.
    assert TOY.kv_bytes_per_token() == 32


def test_qwen25_7b_has_its_published_parameter_count():
    # embedding 152064 x 3584 = 544,997,376 (and the untied head as much); a layer: q, o 3584^2 = 12,845,056 each,
    # k, v 3584 x 512 = 1,835,008 each, MLP 3 x 3584 x 18944 = 203,685,888, biases 4,608, norms 7,168: 233,057,792;
    # x 28 = 6,525,618,176; + final norm 3,584 + 2 x 544,997,376 = 7,615,616,512 ("7.61B", 6.53B non-embedding).
    assert PUBLISHED_SHAPES["Qwen/Qwen2.5-7B-Instruct"].parameters == 7_615_616_512


def test_forward_flops_packed_and_padded_by_hand():
    # Attention FLOP per (query, key) pair: 4 x 2 layers x 2 heads x 4 = 64; linear: 2 x 1232 = 2464 per position.
    assert causal_pairs(3) == 6 and causal_pairs(5) == 15
    # Packed rows of 3 and 5: 8 positions, 6 + 15 = 21 pairs.
    assert forward_count(TOY, [3, 5], packed=True).__dict__ == {
        "tokens": 8,
        "computed_tokens": 8,
        "flops": 2464 * 8 + 64 * 21,
    }
    # Padded to 5 with a mask: 10 positions, every pair of two 5 x 5 squares.
    assert forward_count(TOY, [3, 5], packed=False).__dict__ == {
        "tokens": 8,
        "computed_tokens": 10,
        "flops": 2464 * 10 + 64 * 50,
    }
    # Two rows of 5: no padding, no mask, causal: 2 x 15 pairs.
    assert forward_count(TOY, [5, 5], packed=False).flops == 2464 * 10 + 64 * 30
    # One row alone is never padded.
    assert forward_count(TOY, [7], packed=False) == forward_count(TOY, [7], packed=True)
    assert forward_count(TOY, [], packed=False).flops == 0


def test_shape_from_a_model_folder(tiny_model_dir):
    config = json.loads((Path(tiny_model_dir) / "config.json").read_text())
    shape = ModelShape.from_folder(tiny_model_dir)
    assert (shape.hidden, shape.layers, shape.heads, shape.kv_heads, shape.vocab, shape.tied) == (
        config["hidden_size"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["vocab_size"],
        config["tie_word_embeddings"],
    )
    assert shape.head_dim == config["hidden_size"] // config["num_attention_heads"]  # no head_dim key: the default


def test_a_config_without_a_size_is_refused():
    with pytest.raises(ValueError, match="m: the model config has no intermediate_size"):
        ModelShape.from_config(
            {"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 4}, "m"
        )
