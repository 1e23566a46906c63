"""Training metrics on verl's rows, per trajectory: the answer, and the calls before it by kind.

verl's own training metrics (``critic/score/mean``, ``response_length/mean``, ``training/num_turns/*``)
average over *all* rows, so the calls before the answer count as many times as they occur and long trajectories
weigh more (the fork logged the same averages over turns). These are computed per trajectory ``{uid}_{session_id}``
instead, from its rows:

- ``recurrent/final/reward/mean``: the final answer's reward (what GRPO optimises);
- ``recurrent/final/acc/mean``: the verifier's verdict (``acc`` from the reward, before any shaping);
- ``recurrent/final/response_length/mean``, ``recurrent/final/truncated_ratio``;
- ``recurrent/turns_per_sample/{mean,max,min}``: model calls per trajectory (the answer included);
- ``recurrent/calls/<kind>/length/{mean,max}`` and ``recurrent/calls/<kind>/truncated_ratio``: the calls before the
  answer by their kind (the memory agent's ``memory`` updates: the memory written, and the share cut at
  ``max_memorization_length``; an agent function's calls are ``call`` unless it names them).

Validation needs no counterpart: verl already scores validation on each session's final output only
(``val-core/<data_source>/reward|acc/mean@n``), and the call statistics reach it through the final row's
``reward_extra_info`` (``val-aux/<data_source>/calls|call_tokens|call_truncated/...``, verl_ext/rollout.py).
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


def trajectory_metrics(
    keys: Sequence[str],
    response_lengths: Sequence[int],
    scores: Sequence[float],
    extra_fields: Sequence[dict[str, Any]],
) -> dict[str, float]:
    """Per-trajectory metrics from the rows of a training batch (padding rows already removed).

    ``scores`` are the rows' summed ``rm_scores``; ``extra_fields`` the rows' extra fields as the agent loop
    writes them (``turn_kind``, ``finish_reason``, ``reward_extra_info``).
    """
    if not (len(keys) == len(response_lengths) == len(scores) == len(extra_fields)):
        raise ValueError("keys, response_lengths, scores and extra_fields must have one entry per row")
    if not keys:
        return {}
    finals: dict[str, tuple[int, int]] = {}  # session -> (index, row) of its last output
    turns: dict[str, int] = {}
    for row, key in enumerate(keys):
        session, index = split_key(key)
        turns[session] = turns.get(session, 0) + 1
        if session not in finals or index > finals[session][0]:
            finals[session] = (index, row)
    final_set = {row for _, row in finals.values()}
    by_kind: dict[str, list[int]] = {}  # the calls before each answer, by kind
    for row in range(len(keys)):
        if row not in final_set:
            by_kind.setdefault(str(extra_fields[row].get("turn_kind", "call")), []).append(row)

    final_rows = [row for _, row in finals.values()]
    final_scores = np.array([scores[row] for row in final_rows], dtype=float)
    final_acc = np.array(
        [(extra_fields[row].get("reward_extra_info") or {}).get("acc", scores[row]) for row in final_rows], dtype=float
    )
    final_lengths = np.array([response_lengths[row] for row in final_rows], dtype=float)
    final_truncated = [extra_fields[row].get("finish_reason") == "length" for row in final_rows]
    counts = np.array(list(turns.values()), dtype=float)
    metrics = {
        "recurrent/final/reward/mean": float(final_scores.mean()),
        "recurrent/final/acc/mean": float(final_acc.mean()),
        "recurrent/final/response_length/mean": float(final_lengths.mean()),
        "recurrent/final/truncated_ratio": float(np.mean(final_truncated)),
        "recurrent/turns_per_sample/mean": float(counts.mean()),
        "recurrent/turns_per_sample/max": float(counts.max()),
        "recurrent/turns_per_sample/min": float(counts.min()),
        "recurrent/num_trajectories": float(len(finals)),
    }
    for kind, rows in sorted(by_kind.items()):
        lengths = [response_lengths[row] for row in rows]
        truncated = [extra_fields[row].get("finish_reason") == "length" for row in rows]
        metrics[f"recurrent/calls/{kind}/length/mean"] = float(np.mean(lengths))
        metrics[f"recurrent/calls/{kind}/length/max"] = float(np.max(lengths))
        metrics[f"recurrent/calls/{kind}/truncated_ratio"] = float(np.mean(truncated))
    return metrics


def trajectory_metrics_from_rows(keys: Sequence[str], rows: TensorDict) -> dict[str, float]:
    """:func:`trajectory_metrics` from rows as TransferQueue returns them (``FIELDS``, variable-length tensors
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
    return trajectory_metrics(keys, lengths, scores, extra)
