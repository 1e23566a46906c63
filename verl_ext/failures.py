"""Failed trajectories in training: each one's traceback logged once, and a step that lost them all stops the run.

A trajectory whose agent raises (or whose calls the trainer refuses) stores no rows; its prompt group trains on the
rest, as verl does. When every trajectory of a step (or of a validation) has failed, verl 0.9.1 would go on with
an empty batch and end minutes later with an error of its own (``ValueError: Received an empty list as keys.`` from
TransferQueue). Here the run stops at that point with one line: the count and the first failure, named at its line
of the agent's file (recurrent/failures.py)::

    [memagent] every trajectory of training step 1 failed (16 of 16, 4 prompts); the first: my_agent.py:14:
    ZeroDivisionError: division by zero

The agent-loop workers (verl_ext/agent_loop_manager.py) log each failed trajectory's traceback once and write the
first failure of each prompt into its TransferQueue status tag (``error``), next to verl's ``status``; the trainer
reads those tags for the prompts it samples, before verl's replay buffer clears them (:func:`guard_replay_buffer`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import transfer_queue as tq

from recurrent.failures import describe_failure

# verl's logger of AgentLoopWorkerTQ._run_prompt, which logs every failed session with its traceback.
VERL_WORKER_LOGGER = "verl.trainer.ppo.v1.agent_loop_tq"
ERROR_TAG = "error"  # the key of a prompt's status tag that holds its first failure


class TrajectoryFailed(RuntimeError):
    """One trajectory's failure, already logged with its traceback: verl's worker logs it without one."""


class TrajectoriesFailed(RuntimeError):
    """Every trajectory of a training step or a validation failed: the run stops (verl_ext/main.py)."""


class AlreadyLogged(logging.Filter):
    """Drops verl's log record of a :class:`TrajectoryFailed` (its traceback was logged when it failed)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, TrajectoryFailed)


def log_once_filter() -> None:
    """Install :class:`AlreadyLogged` on verl's worker logger (once per process)."""
    verl_logger = logging.getLogger(VERL_WORKER_LOGGER)
    if not any(isinstance(f, AlreadyLogged) for f in verl_logger.filters):
        verl_logger.addFilter(AlreadyLogged())


async def report_failure(
    logger: logging.Logger,
    reported: set[str],
    uid: str,
    session: Any,
    partition_id: str,
    error: BaseException,
    source: Callable[..., Any] | None,
) -> str:
    """Log a failed trajectory's traceback once and, for the first failure of its prompt, write it into the prompt's
    status tag; returns the one-line message."""
    message = describe_failure(error, source)
    logger.error("agent trajectory %s_%s failed: %s", uid, session, message, exc_info=error)
    if uid not in reported:
        reported.add(uid)
        await tq.async_kv_put(key=uid, partition_id=partition_id, tag={ERROR_TAG: message})
    return message


def first_errors(partition_id: str, uids: list[str]) -> dict[str, str]:
    """The first failure of each of ``uids`` whose tag holds one."""
    tags = (tq.kv_list(partition_id=partition_id) or {}).get(partition_id, {})
    return {uid: str(tags[uid][ERROR_TAG]) for uid in uids if ERROR_TAG in tags.get(uid, {})}


def stop_message(what: str, prompts: int, per_prompt: int, errors: dict[str, str]) -> str:
    """The one line a run stops with when ``what`` lost every trajectory."""
    total = prompts * per_prompt
    first = next(iter(errors.values()), "no failure was recorded (see the agent-loop workers' log)")
    return f"every trajectory of {what} failed ({total} of {total}, {prompts} prompts); the first: {first}"


def guard_replay_buffer(replay_buffer: Any, trainer: Any) -> None:
    """Wrap ``replay_buffer._materialize_batch`` (verl 0.9.1, the one place a sample's batch is built, for training
    and validation) so that a sample without any row raises :class:`TrajectoriesFailed`."""
    materialize = replay_buffer._materialize_batch

    def materialize_checked(partition_id: str, selected: list[str], snapshot: dict) -> Any:
        errors = first_errors(partition_id, selected) if selected else {}
        batch = materialize(partition_id, selected, snapshot)
        if selected and not batch.keys:
            rollout, step = trainer.config.actor_rollout_ref.rollout, trainer.global_steps
            validate = partition_id == "val"
            what = f"the validation at step {step}" if validate else f"training step {step}"
            per_prompt = int(rollout.val_kwargs.n if validate else rollout.n)
            ordered = {uid: errors[uid] for uid in selected if uid in errors}
            raise TrajectoriesFailed(stop_message(what, len(selected), per_prompt, ordered))
        return batch

    replay_buffer._materialize_batch = materialize_checked
