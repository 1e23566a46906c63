"""Padding helpers, against hand-computed expectations."""

import pytest
import torch

from recurrent.padding import (
    attention_mask_from_ids,
    graceful_padding,
    pad_tensor_list_to_length,
    position_ids_from_mask,
    strip_tokens,
)

# --- pad_tensor_list_to_length ---------------------------------------------------------------------------


def test_left_pad_to_longest():
    out = pad_tensor_list_to_length([torch.tensor([5, 6, 7]), torch.tensor([8])], pad_token_id=0)
    assert out.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert out.dtype == torch.long


def test_right_pad_to_max_length_with_mask():
    out, mask = pad_tensor_list_to_length([[5, 6], [7]], pad_token_id=9, max_length=4, left_pad=False, return_mask=True)
    assert out.tolist() == [[5, 6, 9, 9], [7, 9, 9, 9]]
    assert mask.tolist() == [[True, True, False, False], [True, False, False, False]]
    assert mask.dtype == torch.bool


def test_never_truncates():
    out = pad_tensor_list_to_length([[1, 2, 3, 4, 5], [6]], pad_token_id=0, max_length=2)
    assert out.tolist() == [[1, 2, 3, 4, 5], [0, 0, 0, 0, 6]]


def test_mask_comes_from_lengths_not_token_values():
    # The pad id 0 appears as a real token: the mask still marks it real.
    out, mask = pad_tensor_list_to_length([[0, 3], [4]], pad_token_id=0, return_mask=True)
    assert out.tolist() == [[0, 3], [0, 4]]
    assert mask.tolist() == [[True, True], [False, True]]
    assert attention_mask_from_ids(out, 0).tolist() == [[0, 1], [0, 1]]  # the value-based mask cannot tell


def test_empty_rows_and_empty_list():
    out, mask = pad_tensor_list_to_length([[], [1]], pad_token_id=7, max_length=3, return_mask=True)
    assert out.tolist() == [[7, 7, 7], [7, 7, 1]]
    assert mask.tolist() == [[False, False, False], [False, False, True]]
    assert pad_tensor_list_to_length([], pad_token_id=0, max_length=2).shape == (0, 2)


# --- graceful_padding ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bsz, world_size, expected",
    [
        (7, 3, [0, 1, 2, -1, 3, 4, -1, 5, 6]),
        (5, 8, [0, 1, 2, 3, 4, -1, -1, -1]),
        # group_size 3, rem 2: groups [0 1 2] [3 4 5] [- 6 7] [- 8 9]
        (10, 4, [0, 1, 2, 3, 4, 5, -1, 6, 7, -1, 8, 9]),
        # group_size 3, rem 1: group 0 is full, groups 1..7 start with a pad
        (17, 8, [0, 1, 2, -1, 3, 4, -1, 5, 6, -1, 7, 8, -1, 9, 10, -1, 11, 12, -1, 13, 14, -1, 15, 16]),
        (6, 3, [0, 1, 2, 3, 4, 5]),
        (4, 1, [0, 1, 2, 3]),
    ],
)
def test_graceful_padding_examples(bsz, world_size, expected):
    index, keep = graceful_padding(bsz, world_size)
    assert index.dtype == torch.long and keep.dtype == torch.bool
    assert index.tolist() == expected
    assert keep.tolist() == [i >= 0 for i in expected]


@pytest.mark.parametrize("bsz", range(0, 26))
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_graceful_padding_invariants(bsz, world_size):
    index, keep = graceful_padding(bsz, world_size)
    assert len(index) % world_size == 0
    groups = index.view(world_size, -1)  # what each rank receives after an even split
    assert len({len(g) for g in groups}) == 1
    assert int(keep.sum()) == bsz
    assert index[keep].tolist() == list(range(bsz))  # removing pads restores order
    real_per_rank = (groups >= 0).sum(dim=1)
    assert int(real_per_rank.max() - real_per_rank.min()) <= 1  # dummies spread, at most one per rank


def test_graceful_padding_rejects_bad_world_size():
    with pytest.raises(ValueError):
        graceful_padding(3, 0)


# --- masks, positions, stripping -------------------------------------------------------------------------


def test_attention_mask_and_position_ids_left_padded():
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 1]])
    mask = attention_mask_from_ids(ids, pad_id=0)
    assert mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert mask.dtype == torch.long
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]
    assert position_ids_from_mask(torch.tensor([[False, True, True]])).tolist() == [[0, 0, 1]]


def test_strip_tokens_removes_every_occurrence():
    assert strip_tokens([0, 5, 2, 6, 0, 2], [0, 2]) == [5, 6]  # inside, not only trailing (spec P21)
    assert strip_tokens([3, 2, 2], 2) == [3]
    assert strip_tokens([1, 2], [None, 2]) == [1]  # a tokenizer without pad gives None
    out = strip_tokens(torch.tensor([4, 0, 4, 2]), {0, 2})
    assert isinstance(out, torch.Tensor) and out.tolist() == [4, 4]
    assert strip_tokens(torch.tensor([[1, 0], [0, 3]]), [0]).tolist() == [1, 3]
    assert strip_tokens((1, 2), None) == [1, 2]
