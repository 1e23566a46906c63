"""Each row's log-probs at the temperature that sampled it (docs/write_your_own_agent.md, "Sampling of its own").

An agent may sample a call at its own ``temperature`` (hot drafts, a cold vote): the rollout server samples it so,
and its row stores that temperature as its ``temperature`` field (:class:`verl_ext.rollout.RowOutput`; the
rollout's temperature for a call that set none). verl 0.9.1's engines already take a per-row temperature: the FSDP
engine's ``prepare_model_inputs`` reads ``micro_batch["temperature"]``, and a tensor of one value per row divides
each row's logits by its own (``transformer_impl.py``, "support per sample temperature"), in the old, reference and
new log-probs alike, since all three run that forward. What stands in the way is the trainer: before each of those
calls it sets ``extra_info["temperature"] = rollout.temperature`` (``trainer_base.py``: ``_step_once``,
``_compute_old_log_prob``, ``_compute_ref_log_prob``, ``_update_actor``), and the worker writes ``extra_info`` over
the rows' fields (``transferqueue_utils._async_meta_to_realdata``), so one scalar would replace every row's value.

:func:`row_temperatures` takes that scalar out of the batch as it is sent to the actor and reference workers, so
the engine reads the rows' own. For a run whose agents set no temperature every row holds the rollout's, and the
engine divides by the same value it would have: nothing changes. ``top_p`` (and ``top_k``) shape sampling only:
verl's actor computes log-probs over the whole vocabulary, for the rollout's own ``top_p`` too (docs/fidelity.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# The worker-group methods through which verl's trainer sends a step's rows to the actor and the reference policy.
ACTOR_METHODS = ("compute_log_prob", "compute_ref_log_prob", "update_actor")


def without_scalar_temperature(send: Callable[..., Any]) -> Callable[..., Any]:
    """``send`` (a worker-group method taking the batch first) with the batch's scalar ``temperature`` removed."""

    def send_rows(batch: Any, *args: Any, **kwargs: Any) -> Any:
        batch.extra_info.pop("temperature", None)  # the rows' own `temperature` field is read instead
        return send(batch, *args, **kwargs)

    return send_rows


@contextmanager
def row_temperatures(*worker_groups: Any) -> Iterator[None]:
    """Within the block, the :data:`ACTOR_METHODS` of ``worker_groups`` (those they have; None skipped) send each
    batch without its scalar ``temperature``."""
    replaced: list[tuple[Any, str, Any]] = []
    for group in worker_groups:
        for name in ACTOR_METHODS:
            if group is not None and hasattr(group, name):
                original = getattr(group, name)
                replaced.append((group, name, original))
                setattr(group, name, without_scalar_temperature(original))
    try:
        yield
    finally:
        for group, name, original in reversed(replaced):
            setattr(group, name, original)
