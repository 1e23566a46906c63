"""Optimizer updates per training step: the paper's count (``train_batch_size / ppo_mini_batch_size``), not verl's.

verl 0.9.1 cuts a step's rows into mini-batches of ``ppo_mini_batch_size * rollout.n`` *rows*
(``trainer_base.py`` ``_update_actor``; ``engine_workers.py`` ``train_mini_batch``). A memory-agent trajectory is
one row per memory turn plus one for the answer, so with T rows per trajectory verl makes about T times the
paper's number of AdamW updates, each on 1/T of the data. The paper's fork made exactly
``train_batch_size // ppo_mini_batch_size`` updates per step (16 for 7B and 14B) whatever the number of rows.
``recurrent.minibatch`` chooses (docs/fidelity.md, "Mini-batches"):

- ``trajectory`` (default): that many updates; a mini-batch is a contiguous run of whole trajectories (prompt
  by prompt, session by session), so all rows of a trajectory share one update;
- ``turn_major``: that many updates, cut as the fork cut them: rows in turn-major order (every trajectory's
  first memory turn, then the second, ..., the final answers last), split contiguously over the ranks, each
  rank's share split contiguously into the mini-batches;
- ``rows``: verl's own row counting, untouched.

How the paper's count is obtained from stock verl: the worker cuts each rank's rows into equal contiguous
mini-batches of ``mini_batch_size / dp`` rows (``make_iterator``, no shuffle). So the batch is laid out as
``dp`` shards, each the concatenation of ``K`` equal slots, slot ``g`` of shard ``r`` holding rank ``r``'s rows
of mini-batch ``g`` topped up with verl's zero-mask padding rows (no loss, no tokens counted), and the
worker is told ``mini_batch_size = dp * slot``. Within a mini-batch, rows are spread over the ranks by token
count (verl balances whole steps the same way in ``_balance_batch``).

Three actor settings change what the worker does with that layout (:func:`actor_settings`, read by the preflight,
the trainer and ``verl_ext.plan``):

- ``actor.ppo_epochs``: ``make_iterator`` goes over all the mini-batches that many times, in the same order:
  honoured, the plan and the trainer's check count ``epochs x`` the updates (below 1 is refused: no update);
- ``actor.use_dynamic_bsz=false``: the engine cuts each rank's mini-batch into micro-batches of
  ``ppo_micro_batch_size_per_gpu`` rows and asserts that they divide it (``prepare_micro_batches``), and the
  log-prob passes cut each rank's whole shard with their own sizes: honoured, slots are rounded up to a multiple
  of every such size with more padding rows;
- ``actor.shuffle=true``: ``make_iterator`` permutes each rank's rows before cutting them, so every update would
  mix rows of the others: refused with ``trajectory`` and ``turn_major`` (``rows`` is verl's own counting).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from omegaconf import DictConfig

from verl_ext.settings import recurrent_settings


@dataclass(frozen=True)
class Row:
    """What the plan needs of one row of a step: its key ``{uid}_{session}_{index}`` and its length."""

    key: str
    seq_len: int

    @property
    def trajectory(self) -> tuple[str, int]:
        uid, session, _ = self.key.rsplit("_", 2)
        return uid, int(session)

    @property
    def turn(self) -> int:
        return int(self.key.rsplit("_", 1)[1])


@dataclass(frozen=True)
class MiniBatchPlan:
    """A step's row order for the actor update.

    ``order`` lists row positions (into the step's rows) or ``None`` for a zero-mask padding row; it is ``dp``
    shards of ``num_minibatches`` slots of ``slot_rows`` each. ``minibatch_of`` maps a row position to its
    mini-batch (0 .. num_minibatches-1). The worker takes every mini-batch once per epoch (``actor.ppo_epochs``).
    """

    order: list[int | None]
    num_minibatches: int
    slot_rows: int
    dp_size: int
    minibatch_of: dict[int, int]
    epochs: int = 1

    @property
    def updates(self) -> int:
        """Optimizer updates the worker makes on this layout: one per mini-batch per epoch."""
        return self.num_minibatches * self.epochs

    @property
    def minibatch_rows(self) -> int:
        """Rows (padding included) of one mini-batch over all ranks: the worker's ``mini_batch_size``."""
        return self.slot_rows * self.dp_size

    @property
    def num_padding(self) -> int:
        return sum(position is None for position in self.order)


def updates_per_step(train_batch_size: int, ppo_mini_batch_size: int) -> int:
    """The paper's optimizer updates per training step (prompt units: 128 / 8 = 256 / 16 = 16)."""
    if ppo_mini_batch_size <= 0 or train_batch_size <= 0:
        raise ValueError(f"batch sizes must be positive, got {train_batch_size=} {ppo_mini_batch_size=}")
    if train_batch_size % ppo_mini_batch_size:
        raise ValueError(
            f"data.train_batch_size={train_batch_size} is not a multiple of "
            f"actor.ppo_mini_batch_size={ppo_mini_batch_size}"
        )
    return train_batch_size // ppo_mini_batch_size


def trajectory_order(rows: Sequence[Row]) -> list[list[int]]:
    """Row positions grouped by trajectory: prompts in order of first appearance, then session id, each
    trajectory's rows in turn order."""
    first_seen: dict[str, int] = {}
    by_trajectory: dict[tuple[str, int], list[int]] = {}
    for position, row in enumerate(rows):
        uid, session = row.trajectory
        first_seen.setdefault(uid, len(first_seen))
        by_trajectory.setdefault((uid, session), []).append(position)
    ordered = sorted(by_trajectory, key=lambda t: (first_seen[t[0]], t[1]))
    return [sorted(by_trajectory[t], key=lambda p: rows[p].turn) for t in ordered]


def spread_over_ranks(positions: Sequence[int], rows: Sequence[Row], dp_size: int) -> list[list[int]]:
    """Deal one mini-batch's rows to ``dp_size`` ranks: row counts differ by at most one, and each row (longest
    first) goes to the least loaded rank in tokens among those with the fewest rows."""
    shares: list[list[int]] = [[] for _ in range(dp_size)]
    tokens = [0] * dp_size
    for position in sorted(positions, key=lambda p: (-rows[p].seq_len, p)):
        rank = min(range(dp_size), key=lambda r: (len(shares[r]), tokens[r], r))
        shares[rank].append(position)
        tokens[rank] += rows[position].seq_len
    return [sorted(share) for share in shares]


def _chunks(items: Sequence, parts: int) -> list[list]:
    """``items`` cut into ``parts`` contiguous runs whose sizes differ by at most one (earlier runs larger)."""
    return [list(map(int, chunk)) if len(chunk) else [] for chunk in np.array_split(np.asarray(items), parts)]


def plan_minibatches(
    rows: Sequence[Row], num_minibatches: int, dp_size: int, mode: str, row_multiple: int = 1, epochs: int = 1
) -> MiniBatchPlan:
    """The row order that makes verl's worker take exactly ``num_minibatches`` mini-batches (see the module doc),
    each ``epochs`` times; ``slot_rows`` is a multiple of ``row_multiple`` (:attr:`ActorSettings.row_multiple`).

    Fewer trajectories than updates (a step whose prompts mostly failed) gives one update per trajectory.
    """
    if mode not in ("trajectory", "turn_major"):
        raise ValueError(f"plan_minibatches mode must be 'trajectory' or 'turn_major', got {mode!r}")
    if min(dp_size, num_minibatches, row_multiple, epochs) <= 0:
        raise ValueError(f"{dp_size=}, {num_minibatches=}, {row_multiple=} and {epochs=} must be positive")
    trajectories = trajectory_order(rows)
    if not trajectories:
        raise ValueError("no rows to plan mini-batches for")
    k = min(num_minibatches, len(trajectories))
    # slots[g][r]: rank r's rows of mini-batch g.
    if mode == "trajectory":
        groups = _chunks(range(len(trajectories)), k)
        slots = [spread_over_ranks([p for t in g for p in trajectories[t]], rows, dp_size) for g in groups]
    else:
        # The fork's rounds: memory turn 0 of every trajectory, turn 1, ..., then every final answer (the last
        # row of a trajectory), each round in trajectory order.
        rounds = {}
        for index, trajectory in enumerate(trajectories):
            for p in trajectory[:-1]:
                rounds[p] = (0, rows[p].turn, index)
            rounds[trajectory[-1]] = (1, 0, index)
        turn_major = sorted(rounds, key=rounds.__getitem__)
        shards = _chunks(turn_major, dp_size)
        per_rank = [_chunks(shard, k) for shard in shards]
        slots = [[per_rank[r][g] for r in range(dp_size)] for g in range(k)]
    slot_rows = max(1, max(len(share) for group in slots for share in group))
    slot_rows = -(-slot_rows // row_multiple) * row_multiple  # static micro-batches must divide every slot
    order: list[int | None] = []
    minibatch_of: dict[int, int] = {}
    for r in range(dp_size):
        for g, group in enumerate(slots):
            order += group[r] + [None] * (slot_rows - len(group[r]))
            minibatch_of.update({p: g for p in group[r]})
    return MiniBatchPlan(order, k, slot_rows, dp_size, minibatch_of, epochs)


def minibatch_mode(config: object) -> str:
    """``recurrent.minibatch`` of a run config (default ``trajectory``), checked (verl_ext/settings.py)."""
    return recurrent_settings(config).minibatch


def check_updates_made(plan: MiniBatchPlan, made: int | None) -> None:
    """Stop the run when the actor reports another number of optimizer updates than ``plan`` (None: no report)."""
    if made is not None and made != plan.updates:
        raise RuntimeError(
            f"the actor made {made} optimizer updates instead of {plan.updates} ({plan.num_minibatches} mini-batches "
            f"x {plan.epochs} epochs): verl's train_mini_batch no longer cuts mini-batches as verl 0.9.1 did "
            "(verl_ext/minibatch.py); set recurrent.minibatch=rows to use verl's own counting"
        )


@dataclass(frozen=True)
class ActorSettings:
    """What the actor's settings do to a laid-out step (module doc; docs/fidelity.md, "Mini-batches")."""

    epochs: int  # actor.ppo_epochs: the worker takes every mini-batch this many times
    row_multiple: int  # slot rows are a multiple of every static micro-batch size (1: token-budget micro-batches)


# Where verl 0.9.1's engine worker reads static micro-batch sizes: (section, its use_dynamic_bsz key, its size key).
# The actor's for each update's mini-batch; the rollout's (old log-probs) and ref's for each rank's whole shard.
MICRO_BATCH_SETTINGS = (
    ("actor", "use_dynamic_bsz", "ppo_micro_batch_size_per_gpu"),
    ("rollout", "log_prob_use_dynamic_bsz", "log_prob_micro_batch_size_per_gpu"),
    ("ref", "log_prob_use_dynamic_bsz", "log_prob_micro_batch_size_per_gpu"),
)


def _read_actor_settings(config: DictConfig) -> tuple[ActorSettings, list[str]]:
    from verl.trainer.ppo.utils import need_reference_policy

    mode = minibatch_mode(config)
    section = config.actor_rollout_ref
    actor = section.actor
    problems: list[str] = []
    epochs = int(actor.get("ppo_epochs", 1))
    if epochs < 1:
        problems.append(
            f"actor_rollout_ref.actor.ppo_epochs={epochs}: verl's worker would make no optimizer update; set it to 1 "
            "(the paper) or more"
        )
    if bool(actor.get("shuffle", False)) and mode != "rows":
        problems.append(
            f"actor_rollout_ref.actor.shuffle=true with recurrent.minibatch={mode}: verl's worker would shuffle each "
            "rank's rows before cutting them into mini-batches (make_iterator), so every update would mix rows laid "
            "out for the others, cutting trajectories apart; set actor_rollout_ref.actor.shuffle=false (the paper), "
            "or recurrent.minibatch=rows for verl's own row mini-batches"
        )
    sizes = []
    for name, dynamic_key, size_key in MICRO_BATCH_SETTINGS:
        if name == "ref" and not need_reference_policy(config):
            continue
        if bool(section[name].get(dynamic_key, False)):
            continue
        size = section[name].get(size_key)
        if size is None or int(size) < 1:
            value = "unset" if size is None else size
            problems.append(
                f"actor_rollout_ref.{name}.{dynamic_key}=false needs actor_rollout_ref.{name}.{size_key} (rows per "
                f"micro-batch on each GPU), which is {value}: set it to a positive number, or set "
                "actor_rollout_ref.actor.use_dynamic_bsz=true (token-budget micro-batches, the paper's setting)"
            )
        else:
            sizes.append(int(size))
    return ActorSettings(max(epochs, 1), math.lcm(*sizes) if sizes else 1), problems


def actor_setting_problems(config: DictConfig) -> list[str]:
    """Why the actor's ``ppo_epochs``, ``shuffle`` and micro-batch settings cannot run with ``recurrent.minibatch``
    (empty: they can)."""
    return _read_actor_settings(config)[1]


def actor_settings(config: DictConfig) -> ActorSettings:
    """:class:`ActorSettings` of a run config; ``ValueError`` naming every refused setting."""
    settings, problems = _read_actor_settings(config)
    if problems:
        raise ValueError("refused actor settings:\n  - " + "\n  - ".join(problems))
    return settings
