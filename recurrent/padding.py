"""Tensor helpers for batching variable-length turns: padding, masks, position ids, world-size padding.

Masks are built from lengths where lengths are known: a prompt may legitimately contain the pad id (a
document can include ``<|endoftext|>``), so ``ids != pad`` is only a fallback for callers without lengths.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch


def pad_tensor_list_to_length(
    tensors: Sequence[torch.Tensor | Sequence[int]],
    pad_token_id: int,
    max_length: int | None = None,
    left_pad: bool = True,
    return_mask: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D id sequences into a ``(n, width)`` tensor, ``width = max(max_length, longest)``.

    Never truncates: a row longer than ``max_length`` widens the batch (callers that need a fixed width
    re-pad later). With ``return_mask`` also returns a bool mask, True on real tokens, built from lengths.
    """
    rows = [torch.as_tensor(t, dtype=torch.long).reshape(-1) for t in tensors]
    lengths = [len(r) for r in rows]
    width = max([max_length or 0, *lengths])
    out = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (row, n) in enumerate(zip(rows, lengths, strict=True)):
        if n == 0:
            continue
        cols = slice(width - n, width) if left_pad else slice(0, n)
        out[i, cols] = row
        mask[i, cols] = True
    return (out, mask) if return_mask else out


def graceful_padding(bsz: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where to put dummy rows so that ``bsz`` real rows split evenly over ``world_size`` ranks.

    Returns ``padding_index`` (LongTensor: the real row at each slot, -1 at a dummy slot) and
    ``no_padding_mask`` (BoolTensor: True at real slots). With ``group_size = bsz // world_size + 1`` and
    ``rem = bsz % world_size``, the first ``rem`` groups hold only real rows and every later group starts
    with one dummy, so every rank gets the same number of rows and real rows keep their order.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if bsz < 0:
        raise ValueError(f"bsz must be >= 0, got {bsz}")
    rem = bsz % world_size
    if rem == 0:
        return torch.arange(bsz, dtype=torch.long), torch.ones(bsz, dtype=torch.bool)
    group_size = bsz // world_size + 1
    slots = torch.arange(world_size * group_size)
    is_pad = (slots // group_size >= rem) & (slots % group_size == 0)
    no_padding_mask = ~is_pad
    padding_index = torch.cumsum(no_padding_mask.long(), dim=0) - 1
    padding_index[is_pad] = -1
    return padding_index, no_padding_mask


def attention_mask_from_ids(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """``(ids != pad_id)`` as a long tensor (use a lengths-based mask when the lengths are known)."""
    return (ids != pad_id).long()


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch: ``clamp(cumsum(mask) - 1, min=0)`` along the last dim."""
    return torch.clamp(torch.cumsum(mask.long(), dim=-1) - 1, min=0)


def strip_tokens(
    ids: torch.Tensor | Sequence[int], drop_ids: int | Iterable[int | None] | None
) -> torch.Tensor | list[int]:
    """Remove every occurrence of the ``drop_ids`` (not only trailing ones; spec P21).

    A tensor in gives a 1-D tensor out; anything else gives a list of ints. ``None`` entries are ignored,
    so ``strip_tokens(ids, [tok.pad_token_id, tok.eos_token_id])`` works for tokenizers without a pad.
    """
    if drop_ids is None:
        drop: set[int] = set()
    elif isinstance(drop_ids, int):
        drop = {drop_ids}
    else:
        drop = {int(d) for d in drop_ids if d is not None}
    if isinstance(ids, torch.Tensor):
        flat = ids.reshape(-1)
        if not drop:
            return flat.clone()
        keep = ~torch.isin(flat, torch.tensor(sorted(drop), dtype=flat.dtype, device=flat.device))
        return flat[keep]
    return [int(t) for t in ids if int(t) not in drop]


def rollout_tensors(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    prompt_position_ids: torch.Tensor,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """verl's row layout: left-padded prompts and right-padded responses side by side. Response positions
    continue from each row's last prompt position; attention covers the prompt and the valid response."""
    steps = torch.arange(1, responses.shape[1] + 1, dtype=prompt_position_ids.dtype).unsqueeze(0)
    return {
        "prompts": prompt_ids,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, responses], dim=1),
        "attention_mask": torch.cat([prompt_mask.long(), response_mask], dim=1),
        "position_ids": torch.cat([prompt_position_ids, prompt_position_ids[:, -1:] + steps], dim=1),
    }
