"""Sync mode: every trajectory of a batch advances one turn at a time, in lockstep (the paper's released mode).

The lockstep policy is ``recurrent``'s :class:`~recurrent.sync_manager.SessionBatchAgent`: each round holds
the next memory turn of every session still reading, and the final answers of all sessions form the last
round. A round is sent to verl's servers as concurrent token-in/token-out requests and the next round
starts only when every request of this one has returned (a barrier per round). verl's servers take one
request per sequence, so ``recurrent``'s ``SyncGenerationManager`` (which pads a round into one
``generate_sequences`` batch for SPMD rollouts) is not needed here: the batching happens inside the server.

A failed trajectory leaves the lockstep and the rest go on (:func:`run_lockstep`); its prompt group is then
handled as in async mode.

Trade-off against async mode: the same sessions, prompts and rows (the rollout distribution is identical);
async keeps the servers busy while long documents are still being read, lockstep idles them at every
barrier, so it is slower and only worth it for a faithful replay of the released training schedule.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.workers.rollout.replica import TokenOutput

from recurrent.sync_manager import SessionBatchAgent
from verl_ext.agent_loop import request_id_for
from verl_ext.rollout import MemoryRollout


@dataclass
class Trajectory:
    """One rollout of one prompt: its dataset fields (``uid``, ``context``, ...), session id, sampling."""

    sample: dict[str, Any]
    session_id: int
    sampling_params: dict[str, Any]


async def run_lockstep(
    rollout: MemoryRollout, server: Any, trajectories: list[Trajectory]
) -> list[list[AgentLoopOutput] | Exception]:
    """Run every trajectory to its end in lockstep rounds; returns each trajectory's rows (session order), or
    the exception that ended it.

    A trajectory that fails (its session cannot be built, e.g. a question over budget, or one of its requests
    fails) leaves the lockstep; the others go on. What happens to its prompt group is decided by the caller,
    as for async mode (verl_ext/agent_loop_manager.py).
    """
    results: list[list[AgentLoopOutput] | Exception | None] = [None] * len(trajectories)
    sessions = []
    for i, trajectory in enumerate(trajectories):  # contexts tokenized once per uid
        try:
            sessions.append(await rollout.session(trajectory.sample))
        except Exception as err:
            results[i] = err
    running = [i for i, result in enumerate(results) if result is None]  # lockstep index -> trajectory index
    agent = SessionBatchAgent(lambda session: session)
    agent.start(sessions)
    token_outputs: list[list[TokenOutput]] = [[] for _ in trajectories]
    rounds = 0
    while not agent.done():
        rounds += 1
        prompts, meta = agent.action()
        active = meta["sample_index"].tolist()
        max_tokens = int(meta["max_tokens"])
        calls = []
        for j, prompt in zip(active, prompts, strict=True):
            trajectory = trajectories[running[j]]
            params = trajectory.sampling_params
            calls.append(rollout.call(server, request_id_for(trajectory.sample), prompt.tolist(), max_tokens, params))
        replies = await asyncio.gather(*calls, return_exceptions=True)  # the round's barrier
        for j, reply in zip(active, replies, strict=True):
            if isinstance(reply, Exception):
                results[running[j]] = reply
                agent.drop(j)
            elif isinstance(reply, BaseException):  # cancellation and the like stop the whole batch
                agent.end()
                raise reply
            else:
                token_outputs[running[j]].append(reply[0])
        agent.update([reply[1] for reply in replies if not isinstance(reply, BaseException)])
    agent.end()
    for j, session in enumerate(sessions):
        i = running[j]
        if results[i] is None:
            want_logprobs = bool(trajectories[i].sampling_params.get("logprobs"))
            try:
                results[i] = rollout.outputs(session, token_outputs[i], want_logprobs=want_logprobs)
            except Exception as err:
                results[i] = err
    failed = sum(isinstance(result, Exception) for result in results)
    print(f"[memagent] lockstep: {len(trajectories)} trajectories in {rounds} rounds, {failed} failed", flush=True)
    return results  # type: ignore[return-value]
