"""MemAgent training metrics on verl's rows: final answers only, per trajectory.

verl's own training metrics (``critic/score/mean``, ``response_length/mean``, ``training/num_turns/*``)
average over *all* rows, so memory turns count as many times as they occur and long trajectories weigh
more (the fork logged the same averages over turns). These are computed per trajectory ``{uid}_{session_id}`` instead,
from its rows:

- ``memagent/final/reward/mean``: the final answer's reward (what GRPO optimises);
- ``memagent/final/acc/mean``: the verifier's verdict (``acc`` from the reward, before any shaping);
- ``memagent/final/response_length/mean``, ``memagent/final/truncated_ratio``;
- ``memagent/turns_per_sample/{mean,max,min}``: model calls per trajectory (memory turns + final);
- ``memagent/memory_length/{mean,max}``: tokens of each memory update (the memory written);
- ``memagent/memory_truncated_ratio``: share of memory turns cut at ``max_memorization_length``.

Validation needs no counterpart: verl already scores validation on each session's final output only
(``val-core/<data_source>/reward|acc/mean@n``), and the memory statistics reach it through the final
row's ``reward_extra_info`` (``val-aux/<data_source>/memory_turns|memory_tokens|memory_truncated/...``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from tensordict import TensorDict

# The row fields the metrics read from TransferQueue (rm_scores has one entry per response token).
FIELDS = ["rm_scores", "extra_fields"]


def split_key(key: str) -> tuple[str, int]:
    """``{uid}_{session_id}_{index}`` -> (``{uid}_{session_id}``, index), as verl parses row keys."""
    session, _, index = key.rpartition("_")
    if not session or "_" not in session:
        raise ValueError(f"row key {key!r} is not {{uid}}_{{session_id}}_{{index}}")
    return session, int(index)


def memagent_metrics(
    keys: Sequence[str],
    response_lengths: Sequence[int],
    scores: Sequence[float],
    extra_fields: Sequence[dict[str, Any]],
) -> dict[str, float]:
    """Per-trajectory metrics from the rows of a training batch (padding rows already removed).

    ``scores`` are the rows' summed ``rm_scores``; ``extra_fields`` the rows' extra fields as the memory
    agent loop writes them (``turn_kind``, ``finish_reason``, ``reward_extra_info``).
    """
    if not (len(keys) == len(response_lengths) == len(scores) == len(extra_fields)):
        raise ValueError("keys, response_lengths, scores and extra_fields must have one entry per row")
    if not keys:
        return {}
    finals: dict[str, tuple[int, int]] = {}  # session -> (index, row) of its last output
    turns: dict[str, int] = {}
    memory_lengths, memory_truncated = [], []
    for row, key in enumerate(keys):
        session, index = split_key(key)
        turns[session] = turns.get(session, 0) + 1
        if session not in finals or index > finals[session][0]:
            finals[session] = (index, row)
        if extra_fields[row].get("turn_kind") == "memory":
            memory_lengths.append(response_lengths[row])
            memory_truncated.append(extra_fields[row].get("finish_reason") == "length")

    final_rows = [row for _, row in finals.values()]
    final_scores = np.array([scores[row] for row in final_rows], dtype=float)
    final_acc = np.array(
        [(extra_fields[row].get("reward_extra_info") or {}).get("acc", scores[row]) for row in final_rows], dtype=float
    )
    final_lengths = np.array([response_lengths[row] for row in final_rows], dtype=float)
    final_truncated = [extra_fields[row].get("finish_reason") == "length" for row in final_rows]
    counts = np.array(list(turns.values()), dtype=float)
    metrics = {
        "memagent/final/reward/mean": float(final_scores.mean()),
        "memagent/final/acc/mean": float(final_acc.mean()),
        "memagent/final/response_length/mean": float(final_lengths.mean()),
        "memagent/final/truncated_ratio": float(np.mean(final_truncated)),
        "memagent/turns_per_sample/mean": float(counts.mean()),
        "memagent/turns_per_sample/max": float(counts.max()),
        "memagent/turns_per_sample/min": float(counts.min()),
        "memagent/num_trajectories": float(len(finals)),
    }
    if memory_lengths:
        metrics.update(
            {
                "memagent/memory_length/mean": float(np.mean(memory_lengths)),
                "memagent/memory_length/max": float(np.max(memory_lengths)),
                "memagent/memory_truncated_ratio": float(np.mean(memory_truncated)),
            }
        )
    return metrics


def memagent_metrics_from_rows(keys: Sequence[str], rows: TensorDict) -> dict[str, float]:
    """:func:`memagent_metrics` from rows as TransferQueue returns them (``FIELDS``, variable-length tensors
    nested, ``extra_fields`` a stack of dicts)."""
    rm_scores = rows["rm_scores"]
    if rm_scores.is_nested:
        lengths = rm_scores.offsets().diff().tolist()
        rm_scores = rm_scores.to_padded_tensor(padding=0.0)
    else:  # rows of equal length come back as one dense tensor
        lengths = [rm_scores.shape[-1]] * len(rm_scores)
    scores = rm_scores.sum(dim=-1).tolist()
    extra = rows.get("extra_fields")  # a NonTensorStack of dicts (indexing would unwrap it to a list)
    extra = [e if isinstance(e, dict) else {} for e in (extra.tolist() if hasattr(extra, "tolist") else extra)]
    return memagent_metrics(keys, lengths, scores, extra)
