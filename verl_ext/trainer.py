"""The recurrent trainer: verl's V1 synchronous PPO trainer plus final-answer metrics, and its task runner.

``RecurrentPPOTrainer`` is ``PPOTrainerSync`` (verl 0.9.1, ``trainer_sync.py``) with these additions:

- ``_balance_batch`` / ``_update_actor`` make the paper's ``train_batch_size / ppo_mini_batch_size`` optimizer
  updates per step, each on whole trajectories (:mod:`verl_ext.minibatch`; ``recurrent.minibatch=rows`` keeps
  verl's row counting);
- ``_compute_metrics`` adds the per-trajectory metrics of :mod:`verl_ext.metrics` and the failed rollouts of
the
  step (and prints a one-line summary of the step: final-answer reward and verdict, KL loss, advantages, seconds);
- the rollout dump (``trainer.rollout_data_dir``: verl's ``{step}.jsonl``, one line per row with ``input``,
  ``output``, ``gts``, ``score``, ``step`` and the row key as ``uid``) gains the columns of
  :data:`DUMP_COLUMNS` per row, so that a dump shows what every call's row was trained with, and in which update
  (with ``recurrent.dump_token_ids``, also the row's token ids: :data:`TOKEN_ID_COLUMNS`,
  ``python -m verl_ext.rows``);
- the replay buffer's poll interval comes from ``recurrent.replay_poll_interval_s``.

Everything else (GRPO over the final rows of each ``{uid}_{session}`` broadcast to every turn, token-mean
loss, KL loss, DAPO group filtering in the replay buffer, checkpoints, dumps) is verl's.

``RecurrentTaskRunner`` is a copy of ``TaskRunnerV1.run`` (``main_ppo.py:102-163``) that builds this
trainer directly: verl selects trainers by the literal mode ``"sync"`` and refuses to re-register it, so
``trainer.v1.trainer_mode`` stays ``sync`` (under another name verl would silently apply the async
trainer's replay and checkpoint behaviour).
"""

from __future__ import annotations

from collections.abc import Sequence
from pprint import pprint
from typing import Any

import ray
import torch
import transfer_queue as tq
from omegaconf import DictConfig, OmegaConf
from tensordict import TensorDict
from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.seqlen_balancing import log_seqlen_unbalance

from verl_ext.failures import guard_replay_buffer
from verl_ext.metrics import FIELDS, split_key, trajectory_metrics_from_rows
from verl_ext.minibatch import (
    MiniBatchPlan,
    Row,
    actor_settings,
    check_updates_made,
    plan_minibatches,
    updates_per_step,
)
from verl_ext.row_sampling import row_temperatures
from verl_ext.settings import RecurrentSettings, recurrent_settings

# Columns added to each line of the rollout dump (verl's columns are kept as they are):
DUMP_COLUMNS = (
    "trajectory",  # {uid}_{session_id}: the rows of one trajectory (the row key itself is verl's `uid` column)
    "turn_index",  # position of the row in its trajectory (0..; the final answer is the last)
    "turn_kind",  # the call's kind ("memory", "tool_call", ...; the answer's is "final"; None for padding rows)
    "is_padding",  # verl's zero-mask padding rows (trainer_base.py _balance_batch); no loss, advantage 0
    "response_length",  # tokens trained on (valid response tokens)
    "advantage",  # the row's GRPO advantage: the mean over its valid response tokens ...
    "advantage_spread",  # ... and max - min over them (0: one scalar on the whole row, as GRPO gives)
    "minibatch",  # the optimizer update (0..K-1) that trained the row (None with recurrent.minibatch=rows)
    "temperature",  # the temperature that sampled the row: its call's own, else the rollout's
    "top_p",  # the same for top_p
    "request",  # the openai-client request the row's call answered (None: a call on the framework's client) ...
    "choice",  # ... and its choice (0..n-1 of a request with n)
)
# What the extra columns are read from (TransferQueue fields of the step's rows).
DUMP_FIELDS = ["advantages", "response_mask", "extra_fields"]
# With recurrent.dump_token_ids: each row's ids as trained (verl's own columns are text, decoded without special
# tokens), from the rows' `prompts` and `responses` fields; python -m verl_ext.rows prints them.
TOKEN_ID_COLUMNS = {"prompt_ids": "prompts", "response_ids": "responses"}


def dump_columns(
    keys: list[str],
    tags: list[dict],
    rows: Any,
    minibatch_of: dict[str, int] | None = None,
    token_ids: bool = False,
    run_sampling: dict[str, float] | None = None,
) -> dict[str, dict[str, Any]]:
    """The :data:`DUMP_COLUMNS` of each row, keyed by row key, from the rows' :data:`DUMP_FIELDS` and the
    step's mini-batch of each row key; a row's ``temperature`` and ``top_p`` are its call's own, else
    ``run_sampling``'s (the rollout's); with ``token_ids``, also :data:`TOKEN_ID_COLUMNS` (rows with their fields)."""
    run_sampling = run_sampling or {}
    # Nested (jagged) tensors, or dense ones when all rows have one length: unbind gives the rows either way.
    advantages, masks = rows["advantages"].unbind(0), rows["response_mask"].unbind(0)
    extra = rows.get("extra_fields", None)
    extra = [] if extra is None else extra.tolist() if hasattr(extra, "tolist") else list(extra)
    extra = [e if isinstance(e, dict) else {} for e in extra] or [{}] * len(keys)
    columns: dict[str, dict[str, Any]] = {name: {} for name in DUMP_COLUMNS}
    for key, tag, adv, mask, fields in zip(keys, tags, advantages, masks, extra, strict=True):
        padding = bool(tag.get("is_padding", False))
        valid = adv[mask.bool()].double()
        trajectory, index = split_key(key)
        values = {
            "trajectory": trajectory,
            "turn_index": index,
            "turn_kind": None if padding else fields.get("turn_kind"),
            "is_padding": padding,
            "response_length": int(valid.numel()),
            "advantage": float(valid.mean()) if valid.numel() else 0.0,
            "advantage_spread": float(valid.max() - valid.min()) if valid.numel() else 0.0,
            "minibatch": (minibatch_of or {}).get(key),
            **{name: fields.get(name, run_sampling.get(name)) for name in ("temperature", "top_p")},
            "request": fields.get("request"),
            "choice": fields.get("choice"),
        }
        for name, value in values.items():
            columns[name][key] = value
    if token_ids:
        for column, field_name in TOKEN_ID_COLUMNS.items():
            # Nested (jagged) rows unbind to each row's own length: the ids as the agent loop stored them.
            columns[column] = {key: ids.tolist() for key, ids in zip(keys, rows[field_name].unbind(0), strict=True)}
    return columns


class RecurrentPPOTrainer(PPOTrainerSync):
    """``PPOTrainerSync`` plus the paper's optimizer updates per step, credit on every call of a trajectory, and
    per-trajectory metrics."""

    _dump_extra: dict[str, dict[str, Any]] | None = None
    _plan: MiniBatchPlan | None = None  # this step's mini-batches (None: verl's row counting)
    _minibatch_of: dict[str, int] | None = None  # row key -> update index, for the rollout dump
    _failed_groups: frozenset[str] = frozenset()  # prompt groups of this step whose rollout failed
    _settings: RecurrentSettings | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._settings = recurrent_settings(self.config)  # a typo fails here, not after the first rollout
        self.minibatch_mode = self.settings.minibatch
        # ppo_epochs, shuffle and static micro-batches: refused or honoured before the first step (also the preflight)
        self.actor_settings = actor_settings(self.config)
        if self.minibatch_mode != "rows":
            check_minibatch_contract()
        # verl's replay buffer checks for finished rollouts every poll_interval seconds (2.0, a constructor
        # argument it does not read from the config); a CPU step lasts a few seconds, so the CPU runs poll faster.
        if self.settings.replay_poll_interval_s is not None:
            self.replay_buffer.poll_interval = self.settings.replay_poll_interval_s
        guard_replay_buffer(self.replay_buffer, self)  # a sample whose every trajectory failed stops the run

    @property
    def settings(self) -> RecurrentSettings:
        """The run's ``recurrent:`` section (verl_ext/settings.py), parsed once."""
        if self._settings is None:
            self._settings = recurrent_settings(self.config)
        return self._settings

    def on_sample_end(self):
        # The prompt groups of this step whose rollout failed somewhere (verl 0.9.1's replay buffer keeps the set
        # of the last poll; the failed trajectories stored no rows, verl_ext/agent_loop_manager.py).
        self._failed_groups = frozenset(getattr(self.replay_buffer, "failure_keys", {}).get("train", ()))
        super().on_sample_end()

    def _step_once(self, metrics, timing_raw, sample_batch_size):
        # Old, reference and new log-probs at each row's own temperature (verl_ext/row_sampling.py).
        with row_temperatures(self.actor_rollout_wg, getattr(self, "ref_policy_wg", None)):
            return super()._step_once(metrics, timing_raw, sample_batch_size)

    # ---- the paper's updates per step (verl_ext/minibatch.py, docs/fidelity.md "Mini-batches") ----

    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        self._plan, self._minibatch_of = None, None
        if self.minibatch_mode == "rows" or self.use_critic:
            return super()._balance_batch(batch, metrics, logging_prefix, keep_minibatch)
        worker_group = self.actor_rollout_wg
        if "actor" not in worker_group._dispatch_info:
            worker_group._dispatch_info["actor"] = worker_group._query_dispatch_info("actor")
        dp_size = max(worker_group._dispatch_info["actor"]) + 1
        actor = self.config.actor_rollout_ref.actor
        updates = updates_per_step(int(self.config.data.train_batch_size), int(actor.ppo_mini_batch_size))
        rows = [Row(key, int(tag["seq_len"])) for key, tag in zip(batch.keys, batch.tags, strict=True)]
        settings = self.actor_settings
        plan = plan_minibatches(rows, updates, dp_size, self.minibatch_mode, settings.row_multiple, settings.epochs)
        real = len(batch)
        if plan.num_padding:  # verl's zero-mask rows (no loss, no tokens) top up the slots
            batch = upsample_batch_to_divisible_size(batch, real + plan.num_padding, self.tokenizer.eos_token_id)
        pads = iter(range(real, real + plan.num_padding))
        order = [position if position is not None else next(pads) for position in plan.order]
        seq_lens = [int(tag["seq_len"]) for tag in batch.tags]
        batch.reorder(order)
        shard = len(order) // dp_size
        metrics.update(
            log_seqlen_unbalance(
                seqlen_list=seq_lens,
                partitions=[order[r * shard : (r + 1) * shard] for r in range(dp_size)],
                prefix=logging_prefix,
            )
        )
        metrics.update(
            {
                "recurrent/minibatch/updates": plan.updates,
                "recurrent/minibatch/rows": plan.minibatch_rows,
                "recurrent/minibatch/padding_rows": plan.num_padding,
            }
        )
        self._plan = plan
        self._minibatch_of = {batch.keys[new]: plan.minibatch_of[old] for new, old in enumerate(order) if old < real}
        return batch

    def _update_actor(self, batch, metrics):
        plan = self._plan
        if plan is None:
            return super()._update_actor(batch, metrics)
        worker_group = self.actor_rollout_wg
        send = worker_group.update_actor

        def send_planned(planned_batch):
            # verl's _update_actor sets mini_batch_size = ppo_mini_batch_size * n rows; the plan's slots replace it.
            planned_batch.extra_info.update(global_batch_size=plan.minibatch_rows, mini_batch_size=plan.minibatch_rows)
            output = send(planned_batch)
            made = optimizer_updates(output["metrics"])
            if made is not None:
                metrics["recurrent/minibatch/updates_made"] = made
            check_updates_made(plan, made)
            return output

        worker_group.update_actor = send_planned
        try:
            return super()._update_actor(batch, metrics)
        finally:
            worker_group.update_actor = send

    # ---- credit assignment: the final reward becomes every turn's advantage ----

    def _compute_advantage(self, batch, metrics):
        """Where a trajectory's one final reward becomes the advantage of every one of its turns (the paper's
        multi-conversation GRPO; docs/fidelity.md, "Credit on every turn"). The rule is verl's, in two steps that
        ``super()`` runs over the step's rows (keys ``{uid}_{session}_{index}``: prompt, trajectory, call):

        1. the reward: verl's reward loop scores each trajectory's last row (the final answer, with the run's
           reward function: for the memory agent the strict verifier, configs/memory_agent.yaml) and its agent-loop
           worker copies that score to every row of the trajectory (``token_level_scores``);
        2. the advantage: ``compute_advantage_for_multi_trajectories`` (verl/trainer/ppo/v1/utils.py) takes one
           score per ``{uid}_{session}``, GRPO over each prompt's ``rollout.n`` trajectories (no std division,
           ``algorithm.norm_adv_by_std_in_grpo=false``), and puts the trajectory's advantage on every response
           token of every row of it.

        Checked by hand on rows shaped like ours: tests/verl_ext/test_vx_advantage.py. Then, only for the ablations
        (``recurrent.credit`` other than ``all``), the rows before each answer lose their advantage and loss terms
        (:func:`earlier_credit_fields`; tests/verl_ext/test_vx_credit.py)."""
        batch = super()._compute_advantage(batch, metrics)
        mode = self.settings.credit
        if mode != "all":
            earlier = earlier_row_keys(batch.keys, batch.tags)
            if earlier:
                rows = tq.kv_batch_get(keys=earlier, partition_id=batch.partition_id, select_fields=["response_mask"])
                fields = earlier_credit_fields(mode, rows["response_mask"].unbind(0))
                tq.kv_batch_put(keys=earlier, partition_id=batch.partition_id, fields=TensorDict(fields, len(earlier)))
            metrics["recurrent/credit/earlier_rows_masked"] = len(earlier)
        return batch

    # ---- metrics and dumps ----

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        real = [i for i, tag in enumerate(batch.tags) if not tag.get("is_padding", False)]
        if not real:
            return
        keys = [batch.keys[i] for i in real]
        rows = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=FIELDS)
        metrics.update(trajectory_metrics_from_rows(keys, rows))
        metrics.update(failure_metrics(keys, self._failed_groups, int(self.config.actor_rollout_ref.rollout.n)))
        print(step_summary(global_steps, metrics), flush=True)

    def _log_rollout_data(self, batch, timing_raw, rollout_data_dir):
        # verl's dump (trainer_base.py:1297-1340) with DUMP_COLUMNS: they are read here and merged, by row key,
        # into what verl hands to _dump_generations (its `uid` column holds the sorted row keys).
        token_ids = self.settings.dump_token_ids
        fields = DUMP_FIELDS + (list(TOKEN_ID_COLUMNS.values()) if token_ids else [])
        rows = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        rollout = self.config.actor_rollout_ref.rollout
        run_sampling = {"temperature": float(rollout.temperature), "top_p": float(rollout.top_p)}
        self._dump_extra = dump_columns(
            list(batch.keys), list(batch.tags), rows, self._minibatch_of, token_ids, run_sampling
        )
        try:
            super()._log_rollout_data(batch, timing_raw, rollout_data_dir)
        finally:
            self._dump_extra = None

    def _dump_generations(self, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path):
        if self._dump_extra is not None:  # a training-rollout dump (validation dumps are verl's)
            keys = reward_extra_infos_dict["uid"]
            reward_extra_infos_dict = {
                **reward_extra_infos_dict,
                **{name: [values[key] for key in keys] for name, values in self._dump_extra.items()},
            }
        super()._dump_generations(inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path)


def earlier_credit_fields(mode: str, response_masks: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The fields a ``final_*`` credit mode (verl_ext/settings.py) writes over the rows of the calls before
    each
    trajectory's answer (``response_masks``: theirs, as stored):
    zero advantages and response masks (no policy-gradient or KL term), and for ``final_token_mean`` a zero
    ``loss_mask`` (no tokens in the update's normalizer)."""
    if mode not in ("final_same_step", "final_token_mean"):
        raise ValueError(f"no fields for the earlier rows under recurrent.credit={mode!r}")
    zeros = [torch.zeros_like(mask) for mask in response_masks]
    fields = {
        "response_mask": torch.nested.as_nested_tensor(zeros, layout=torch.jagged),
        "advantages": torch.nested.as_nested_tensor([z.float() for z in zeros], layout=torch.jagged),
    }
    if mode == "final_token_mean":
        fields["loss_mask"] = torch.nested.as_nested_tensor([z.clone() for z in zeros], layout=torch.jagged)
    return fields


def earlier_row_keys(keys: list[str], tags: list[dict]) -> list[str]:
    """The rows of a step that are not the last row of their trajectory (the calls before its answer: the memory
    agent's memory updates); padding rows excluded."""
    last: dict[str, int] = {}
    real = [key for key, tag in zip(keys, tags, strict=True) if not tag.get("is_padding", False)]
    for key in real:
        trajectory, index = split_key(key)
        last[trajectory] = max(index, last.get(trajectory, index))
    return [key for key in real if split_key(key)[1] < last[split_key(key)[0]]]


def failure_metrics(keys: list[str], failed_groups: frozenset[str] | set[str], n: int) -> dict[str, int]:
    """Prompt groups of the step with a failed rollout, and the trajectories they lost (``n`` minus those that
    stored rows)."""
    present: dict[str, set[str]] = {uid: set() for uid in failed_groups}
    for key in keys:
        uid, session, _ = key.rsplit("_", 2)
        if uid in present:
            present[uid].add(session)
    return {
        "recurrent/rollout/failed_groups": len(failed_groups),
        "recurrent/rollout/failed_trajectories": sum(n - len(sessions) for sessions in present.values()),
    }


def check_minibatch_contract() -> None:
    """The paper's update count relies on verl 0.9.1's worker cutting each rank's rows into equal contiguous
    mini-batches of ``mini_batch_size / dp`` (``train_mini_batch`` + ``make_iterator``, no shuffle). Another verl
    may cut differently: refuse to start rather than train with another count."""
    import verl

    if verl.__version__ != "0.9.1":
        raise RuntimeError(
            f"recurrent.minibatch=trajectory|turn_major was written against verl 0.9.1's mini-batching, this is verl "
            f"{verl.__version__}: re-check verl_ext/minibatch.py against it, or set recurrent.minibatch=rows"
        )


def optimizer_updates(actor_metrics: dict[str, Any]) -> int | None:
    """The number of optimizer updates an ``update_actor`` call made: the engine reports one ``grad_norm`` per
    update (None when the metrics do not say)."""
    values = actor_metrics.get("grad_norm")
    return len(values) if isinstance(values, list) else None


SUMMARY = (
    ("reward", "recurrent/final/reward/mean"),
    ("acc", "recurrent/final/acc/mean"),
    ("kl", "actor/kl_loss"),
    ("pg_loss", "actor/pg_loss"),
    ("adv_min", "critic/advantages/min"),
    ("adv_max", "critic/advantages/max"),
    ("trajectories", "recurrent/num_trajectories"),
    ("turns", "recurrent/turns_per_sample/mean"),
    ("step_s", "timing_s/step"),
)


def step_summary(step: int, metrics: dict[str, Any]) -> str:
    """One line per training step: the final-answer reward and verdict, KL, advantages, time, and the
    validation's mean reward and verdict per data source when this step validated."""
    parts = [f"{name}={float(metrics[key]):.4g}" for name, key in SUMMARY if key in metrics]
    validation: dict[tuple[str, str], tuple[int, float]] = {}  # (source, reward|acc) -> (n, mean@n), largest n
    for key, value in metrics.items():
        section, source, var, stat = (key.split("/") + ["", "", ""])[:4]
        if section in ("val-core", "val-aux") and var in ("reward", "acc") and stat.startswith("mean@"):
            n = int(stat.removeprefix("mean@")) if stat.removeprefix("mean@").isdigit() else 0
            if n >= validation.get((source, var), (-1, 0.0))[0]:
                validation[(source, var)] = (n, float(value))
    parts += [f"val_{var}[{source}]={value:.4g}" for (source, var), (_, value) in sorted(validation.items())]
    return f"[recurrent] step {step}: " + " ".join(parts)


def check_registrations() -> None:
    """Fail loudly if our agent loop is not registered (verl swallows plugin import errors)."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    from verl_ext.agent_loop import AGENT_LOOP_NAME  # registers the loop in this process

    if AGENT_LOOP_NAME not in _agent_loop_registry:
        raise RuntimeError(f"the {AGENT_LOOP_NAME} loop is not registered in verl's agent-loop registry")


@ray.remote(num_cpus=1)
class RecurrentTaskRunner:
    """``TaskRunnerV1`` with :class:`RecurrentPPOTrainer` and our agent-loop manager."""

    def run(self, config: DictConfig) -> None:
        from verl.utils.import_utils import load_class_from_fqn
        from verl.utils.logging_utils import configure_verl_logging

        from verl_ext.cluster import check_task_runner_node

        # Before anything can wait on Ray for resources it lacks (tq.init would hang): GPUs, CPUs, and the paths
        # resolved on the launching node, as this node sees them.
        check_task_runner_node(config)
        configure_verl_logging()
        check_registrations()
        config.transfer_queue.enable = True
        pprint(OmegaConf.to_container(config, resolve=True))
        OmegaConf.resolve(config)
        tq.init(config.transfer_queue)
        trainer: Any = None
        succeeded = False
        try:
            trainer = RecurrentPPOTrainer(config=config)
            trainer.init()
            # configs/recurrent_trainer.yaml sets the class from recurrent.mode
            # (verl_ext/agent_loop_manager.py).
            fqn = config.actor_rollout_ref.rollout.agent.get("agent_loop_manager_class")
            if not fqn:
                raise ValueError("actor_rollout_ref.rollout.agent.agent_loop_manager_class is not set")
            manager = load_class_from_fqn(fqn, "AgentLoopManager").create(
                config=config,
                llm_client=trainer.get_llm_client(),
                teacher_client=trainer.get_teacher_client(),
                reward_loop_worker_handles=trainer.get_reward_handles(),
            )
            trainer.fit(manager)
            succeeded = True
        finally:
            try:
                tracking = getattr(trainer, "logger", None)
                if tracking is not None:
                    tracking.finish(exit_code=0 if succeeded else 1)
            finally:
                tq.close()
