"""A failed trajectory's traceback is logged once (verl_ext/failures.py): our worker logs it when the trajectory
fails, and verl 0.9.1's ``AgentLoopWorkerTQ._run_prompt``, which logs every failed session again with its traceback,
has that record dropped by the once-only filter. verl's own ``_run_prompt`` runs here, over our worker's
``_run_agent_loop``; only the trajectory under it is scripted (its agent raises)."""

from __future__ import annotations

import logging

import pytest
import transfer_queue as tq
from omegaconf import OmegaConf
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

from verl_ext import failures
from verl_ext.agent_loop import AGENT_LOOP_NAME
from verl_ext.agent_loop_manager import RecurrentAgentLoopWorkerImpl


class RaisingTrajectory(AgentLoopWorkerTQ.__ray_actor_class__):
    """verl's agent loop of one trajectory, whose agent raises a KeyError."""

    async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name=None, trace=True, **kwargs):
        return {}["question"]


class Worker(RecurrentAgentLoopWorkerImpl, RaisingTrajectory):
    """Our worker over that trajectory (not started as a Ray actor: its ``__init__`` builds verl's servers)."""


@pytest.fixture
def worker(monkeypatch):
    tags = []

    async def put(key, partition_id, tag):
        tags.append((key, partition_id, tag))

    monkeypatch.setattr(tq, "async_kv_put", put)
    verl_logger = logging.getLogger(failures.VERL_WORKER_LOGGER)
    filters = list(verl_logger.filters)
    failures.log_once_filter()  # as our worker's __init__ does
    made = object.__new__(Worker)
    made.config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": 2, "val_kwargs": {"n": 1}}}})
    made.tokenizer = None  # the agent cannot be built from this config: the failure is named without its line
    yield made, tags
    verl_logger.filters[:] = filters


@pytest.mark.timeout(30)
async def test_each_failed_trajectorys_traceback_is_logged_once(worker, caplog):
    made, tags = worker
    with caplog.at_level(logging.ERROR):
        await made._run_prompt(
            {"uid": "u1", "agent_name": AGENT_LOOP_NAME}, {"temperature": 1.0}, trajectory={"validate": False}
        )
    tracebacks = [record for record in caplog.records if record.exc_info]
    # two sessions (rollout.n=2), each failed once: two tracebacks, ours, and none of verl's
    assert [record.getMessage() for record in tracebacks] == [
        "agent trajectory u1_0 failed: KeyError: 'question'",
        "agent trajectory u1_1 failed: KeyError: 'question'",
    ]
    assert ("u1", "train", {"error": "KeyError: 'question'"}) in tags  # the prompt's first failure, for the trainer
    assert ("u1", "train", {"status": "failure"}) in tags  # verl's own status: it saw the failures
