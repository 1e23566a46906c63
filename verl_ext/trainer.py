"""The recurrent trainer: verl's V1 synchronous PPO trainer plus final-answer metrics, and its task runner.

``RecurrentPPOTrainer`` is ``PPOTrainerSync`` (verl 0.9.1, ``trainer_sync.py``) with two additions:

- ``_compute_metrics`` adds the per-trajectory metrics of :mod:`verl_ext.metrics` (and prints a one-line
  summary of the step: final-answer reward and verdict, KL loss, advantages, seconds);
- the rollout dump (``trainer.rollout_data_dir``: verl's ``{step}.jsonl``, one line per row with ``input``,
  ``output``, ``gts``, ``score``, ``step`` and the row key as ``uid``) gains the columns of
  :data:`DUMP_COLUMNS` per row, so that a dump shows what every memory turn was trained with.

Everything else (GRPO over the final rows of each ``{uid}_{session}`` broadcast to every turn, token-mean
loss, KL loss, DAPO group filtering in the replay buffer, checkpoints, dumps) is verl's.

``RecurrentTaskRunner`` is a copy of ``TaskRunnerV1.run`` (``main_ppo.py:102-163``) that builds this
trainer directly: verl selects trainers by the literal mode ``"sync"`` and refuses to re-register it, so
``trainer.v1.trainer_mode`` stays ``sync`` (VERL_NOTES R3).
"""

from __future__ import annotations

from pprint import pprint
from typing import Any

import ray
import transfer_queue as tq
from omegaconf import DictConfig, OmegaConf
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from verl_ext.metrics import FIELDS, memagent_metrics_from_rows, split_key

DEFAULT_MANAGER = "verl_ext.agent_loop_manager.MemoryAgentLoopManager"

# Columns added to each line of the rollout dump (verl's columns are kept as they are):
DUMP_COLUMNS = (
    "trajectory",  # {uid}_{session_id}: the rows of one trajectory (the row key itself is verl's `uid` column)
    "turn_index",  # position of the row in its trajectory (0..; the final answer is the last)
    "turn_kind",  # "memory" | "final" (None for verl's padding rows)
    "is_padding",  # verl's zero-mask padding rows (trainer_base.py _balance_batch); no loss, advantage 0
    "response_length",  # tokens trained on (valid response tokens)
    "advantage",  # the row's GRPO advantage: the mean over its valid response tokens ...
    "advantage_spread",  # ... and max - min over them (0: one scalar on the whole row, as GRPO gives)
)
# What the extra columns are read from (TransferQueue fields of the step's rows).
DUMP_FIELDS = ["advantages", "response_mask", "extra_fields"]


def dump_columns(keys: list[str], tags: list[dict], rows: Any) -> dict[str, dict[str, Any]]:
    """The :data:`DUMP_COLUMNS` of each row, keyed by row key, from the rows' :data:`DUMP_FIELDS`."""
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
        }
        for name, value in values.items():
            columns[name][key] = value
    return columns


class RecurrentPPOTrainer(PPOTrainerSync):
    """``PPOTrainerSync`` plus MemAgent's final-answer, turn and memory metrics."""

    _dump_extra: dict[str, dict[str, Any]] | None = None

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        real = [i for i, tag in enumerate(batch.tags) if not tag.get("is_padding", False)]
        if not real:
            return
        keys = [batch.keys[i] for i in real]
        rows = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=FIELDS)
        metrics.update(memagent_metrics_from_rows(keys, rows))
        print(step_summary(global_steps, metrics), flush=True)

    def _log_rollout_data(self, batch, timing_raw, rollout_data_dir):
        # verl's dump (trainer_base.py:1297-1340) with DUMP_COLUMNS: they are read here and merged, by row key,
        # into what verl hands to _dump_generations (its `uid` column holds the sorted row keys).
        rows = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=DUMP_FIELDS)
        self._dump_extra = dump_columns(list(batch.keys), list(batch.tags), rows)
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


SUMMARY = (
    ("reward", "memagent/final/reward/mean"),
    ("acc", "memagent/final/acc/mean"),
    ("kl", "actor/kl_loss"),
    ("pg_loss", "actor/pg_loss"),
    ("adv_min", "critic/advantages/min"),
    ("adv_max", "critic/advantages/max"),
    ("trajectories", "memagent/num_trajectories"),
    ("turns", "memagent/turns_per_sample/mean"),
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
    return f"[memagent] step {step}: " + " ".join(parts)


def check_registrations() -> None:
    """Fail loudly if the memory agent loop is not registered (verl swallows plugin import errors, R7)."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    import verl_ext.agent_loop  # noqa: F401  (registers memory_agent in this process)

    if "memory_agent" not in _agent_loop_registry:
        raise RuntimeError("the memory_agent loop is not registered in verl's agent-loop registry")


@ray.remote(num_cpus=1)
class RecurrentTaskRunner:
    """``TaskRunnerV1`` with :class:`RecurrentPPOTrainer` and the memory agent-loop manager."""

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
            fqn = config.actor_rollout_ref.rollout.agent.get("agent_loop_manager_class") or DEFAULT_MANAGER
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
