"""verl's V1 agent-loop managers and workers, extended for multi-call agents: one manager per rollout mode.

verl builds the manager class named by ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` (verl's
``TaskRunnerV1.init_agent_loop_manager`` and our ``RecurrentTaskRunner``). ``configs/recurrent_trainer.yaml``
sets that key from ``recurrent.mode`` (``recurrent.manager_class``), the one place where the mode picks a class:

- async (default), :class:`RecurrentAgentLoopManager`: verl's own behaviour. The batch is split over the agent-loop
  workers and every trajectory runs its own ``recurrent_agent`` loop (:mod:`verl_ext.agent_loop`).
- sync, :class:`LockstepAgentLoopManager`: the whole batch goes to one worker (round-robin over calls), which
  runs all its trajectories in lockstep rounds (:mod:`verl_ext.sync_rollout`) and then stores them exactly as
  verl's worker does (reward on the last output, copied to the earlier ones; keys ``{uid}_{session_id}_{index}``).
  With DAPO dynamic sampling verl fetches prompts one at a time (``gen_batch_size=1``), so lockstep then
  spans the ``n`` rollouts of one prompt only.

Both modes: only the final answer is sent to the reward worker (works around a padding bug of verl
0.9.1's multi-output scoring, see ``_compute_score``), with the whole trajectory in its ``extra_info`` (every
call's messages and reply, the sample, the agent's own score: docs/write_your_own_agent.md, "A reward over the
whole trajectory"); the final row's ``reward_extra_info`` gains the trajectory's call statistics (so verl's
validation reports them per data source); the columns the agent calls large (the memory agent's document) are not
copied into every stored row (verl's worker copies every dataset column into each row it stores); and a failed
trajectory's traceback is logged once, its prompt's first failure written into the prompt's status tag for the
trainer (verl_ext/failures.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray
import torch
import transfer_queue as tq
from tensordict import NonTensorData, NonTensorStack, TensorDict
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, AgentLoopWorker
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ, apply_greedy_sampling_params

from verl_ext.failures import TrajectoryFailed, log_once_filter, report_failure
from verl_ext.rollout import AgentRollout, episode_stats, reward_extra_info
from verl_ext.sync_rollout import Trajectory, run_trajectories

logger = logging.getLogger(__name__)


class RecurrentAgentLoopWorkerImpl(AgentLoopWorkerTQ.__ray_actor_class__):
    """verl's ``AgentLoopWorkerTQ`` (async mode) plus call statistics, without the agent's large columns."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # AgentLoopWorkerTQ.__init__ (agent_loop_tq.py:54-57) calls zero-argument super(), whose class cell is
        # not a base of the class Ray builds from this subclass ("TypeError: super(type, obj)" at actor
        # creation). Do what it does, naming the grandparent explicitly.
        AgentLoopWorker.__init__(self, *args, **kwargs)
        tq.init()
        self.background_tasks = set()
        log_once_filter()

    async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
        try:
            return await super()._run_agent_loop(
                sampling_params, trajectory, agent_name=agent_name, trace=trace, **kwargs
            )
        except Exception as err:  # logged here once; verl's worker logs the short one without its traceback
            message = await self._report(kwargs["uid"], kwargs.get("session_id"), trajectory["validate"], err)
            raise TrajectoryFailed(message) from None

    async def _report(self, uid: str, session: Any, validate: bool, error: BaseException) -> str:
        try:
            source = AgentRollout.get(self.config, self.tokenizer).source
        except Exception:  # the agent itself cannot be built: the error says so, without a line of it
            source = None
        partition_id = "val" if validate else "train"
        reported = self.__dict__.setdefault("reported_prompts", set())  # prompts whose first failure is tagged
        return await report_failure(logger, reported, uid, session, partition_id, error, source)

    async def _agent_loop_postprocess(self, output, validate, **kwargs) -> None:
        for column in AgentRollout.get(self.config, self.tokenizer).large_columns:
            kwargs.pop(column, None)
        return await super()._agent_loop_postprocess(output, validate, **kwargs)

    async def _compute_score(self, outputs: list[AgentLoopOutput], kwargs: dict) -> None:
        # Only the final answer goes to the reward worker. verl 0.9.1 sends every output of the trajectory,
        # right-padded to a common length, and its managers take the last row's response length from the last
        # `response_width` columns of its attention mask (naive.py:38-39, dapo.py:56-57). When the final row is
        # shorter than the longest memory row (the final prompt has no chunk), those columns are padding, the
        # decoded answer is cut short and a correct answer scores 0. The managers score data[-1:] only anyway.
        await super()._compute_score(outputs[-1:], {**kwargs, "extra_info": self._reward_extra_info(outputs, kwargs)})
        info = outputs[-1].extra_fields.get("reward_extra_info")
        if isinstance(info, dict) and "turn_kind" in outputs[-1].extra_fields:
            info.update(episode_stats(outputs))

    def _reward_extra_info(self, outputs: list[AgentLoopOutput], kwargs: dict) -> dict:
        """The reward function's ``extra_info``: the row's own, plus the agent's score (``agent_score``) and, with
        ``recurrent.reward_trajectory``, every call (``trajectory``) and the sample (``sample``, its large columns
        left out)."""
        with_trajectory = AgentRollout.get(self.config, self.tokenizer).settings.reward_trajectory
        return reward_extra_info(outputs, kwargs, with_trajectory)


class LockstepAgentLoopWorkerImpl(RecurrentAgentLoopWorkerImpl):
    """The sync-mode worker: all trajectories of its batch in lockstep rounds, stored as verl's worker stores them."""

    async def generate_sequences(self, batch: TensorDict) -> None:
        validate, sampling_params, prompts = self._unpack(batch)
        task = asyncio.create_task(self._run_lockstep_batch(prompts, sampling_params, validate))
        self.background_tasks.add(task)  # fire-and-forget, as verl's worker: rows arrive through TransferQueue
        task.add_done_callback(self.background_tasks.discard)

    def _unpack(self, batch: TensorDict) -> tuple[bool, dict[str, Any], list[dict[str, Any]]]:
        """Sampling parameters and per-prompt fields, as ``AgentLoopWorkerTQ.generate_sequences`` builds them
        (``verl/trainer/ppo/v1/agent_loop_tq.py:57-103``)."""
        validate = bool(batch["validate"]) if "validate" in batch else False
        batch.pop("validate", None)
        config = self.config.actor_rollout_ref.rollout
        sampling_params = dict(
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            repetition_penalty=1.0,
            logprobs=config.calculate_log_probs,
        )
        if validate:
            sampling_params.update(
                top_p=config.val_kwargs.top_p, top_k=config.val_kwargs.top_k, temperature=config.val_kwargs.temperature
            )
        prompts = []
        for i in range(len(batch)):
            prompt = {}
            for key, value in batch.items():
                if isinstance(value, torch.Tensor):
                    prompt[key] = value[i]
                elif isinstance(value, NonTensorStack):
                    prompt[key] = value[i].data
                elif isinstance(value, NonTensorData):
                    prompt[key] = value.data
            prompts.append(prompt)
        return validate, sampling_params, prompts

    async def _run_lockstep_batch(self, prompts: list[dict], sampling_params: dict[str, Any], validate: bool) -> None:
        partition_id = "val" if validate else "train"
        uids = [prompt["uid"] for prompt in prompts]
        for uid in uids:
            await tq.async_kv_put(key=uid, partition_id=partition_id, tag={"status": "running"})
        config = self.config.actor_rollout_ref.rollout
        trajectories = []
        for prompt in prompts:
            n = int(prompt.pop("__rollout_n__", config.val_kwargs.n if validate else config.n))
            params = dict(sampling_params)
            if not validate and not prompt.pop("__do_sample__", True):
                apply_greedy_sampling_params(params)
            prompt.pop("agent_name", None)
            trajectories += [Trajectory({**prompt, "session_id": i}, i, params) for i in range(n)]

        # As verl's async worker (AgentLoopWorkerTQ._run_prompt): a failed trajectory is logged and stores no
        # rows, its finished siblings are stored, and its prompt's status is "failure" (the replay buffer then
        # trains on what the group has); other prompts are not affected.
        try:
            rollout = AgentRollout.get(self.config, self.tokenizer)
            results = await run_trajectories(rollout, self.llm_client, trajectories)
        except Exception as err:  # the whole batch (e.g. the workflow cannot be built)
            results = [err] * len(trajectories)
        finished = [(t, r) for t, r in zip(trajectories, results, strict=True) if not isinstance(r, Exception)]
        stored = await asyncio.gather(
            *(self._agent_loop_postprocess(result, validate, **t.sample) for t, result in finished),
            return_exceptions=True,
        )
        errors = [(t, r) for t, r in zip(trajectories, results, strict=True) if isinstance(r, Exception)]
        errors += [(t, r) for (t, _), r in zip(finished, stored, strict=True) if isinstance(r, BaseException)]
        failed: set[str] = set()
        for trajectory, error in errors:
            uid = trajectory.sample["uid"]
            await self._report(uid, trajectory.session_id, validate, error)
            failed.add(uid)
        for uid in uids:
            status = "failure" if uid in failed else "finished"
            await tq.async_kv_put(key=uid, partition_id=partition_id, tag={"status": status})


class RecurrentAgentLoopManager(AgentLoopManagerTQ):
    """Async mode: ``AgentLoopManagerTQ`` with :class:`RecurrentAgentLoopWorkerImpl` workers."""

    worker_impl: type[RecurrentAgentLoopWorkerImpl] = RecurrentAgentLoopWorkerImpl

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = ray.remote(self.worker_impl)  # workers are created later, in create()


class LockstepAgentLoopManager(RecurrentAgentLoopManager):
    """Sync mode: the whole batch to one :class:`LockstepAgentLoopWorkerImpl` worker per call."""

    worker_impl = LockstepAgentLoopWorkerImpl

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._next_worker = 0

    def generate_sequences(self, prompts: TensorDict) -> None:
        # Lockstep spans the whole batch: one worker runs it, the next call goes to the next worker.
        worker = self.agent_loop_workers[self._next_worker % len(self.agent_loop_workers)]
        self._next_worker += 1
        ray.get(worker.generate_sequences.remote(prompts))
