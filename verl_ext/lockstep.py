"""Sync mode: every trajectory of a batch advances one turn at a time, in lockstep (the paper's released mode).

The lockstep policy is ``recurrent``'s :class:`~recurrent.sync_manager.SessionBatchAgent`: each round holds
the next memory turn of every session still reading, and the final answers of all sessions form the last
round. A round is sent to verl's servers as concurrent token-in/token-out requests and the next round
starts only when every request of this one has returned (a barrier per round). verl's servers take one
request per sequence, so ``recurrent``'s ``SyncGenerationManager`` (which pads a round into one
``generate_sequences`` batch for SPMD rollouts) is not needed here: the batching happens inside the server.

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
) -> list[list[AgentLoopOutput]]:
    """Run every trajectory to its end in lockstep rounds; returns each trajectory's rows (session order).

    A failed request fails the whole batch (after the round settles): sessions cannot skip a round.
    """
    sessions = [await rollout.session(t.sample) for t in trajectories]  # contexts tokenized once per uid
    agent = SessionBatchAgent(lambda session: session)
    agent.start(sessions)
    token_outputs: list[list[TokenOutput]] = [[] for _ in trajectories]
    while not agent.done():
        prompts, meta = agent.action()
        rows = meta["sample_index"].tolist()
        max_tokens = int(meta["max_tokens"])
        calls = [
            rollout.call(
                server,
                request_id_for(trajectories[i].sample),
                prompt.tolist(),
                max_tokens,
                trajectories[i].sampling_params,
            )
            for i, prompt in zip(rows, prompts, strict=True)
        ]
        results = await asyncio.gather(*calls, return_exceptions=True)  # the round's barrier
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            agent.end()
            raise errors[0]
        for i, (output, _) in zip(rows, results, strict=True):
            token_outputs[i].append(output)
        agent.update([reply for _, reply in results])
    agent.end()
    return [
        rollout.outputs(session, outs, want_logprobs=bool(t.sampling_params.get("logprobs")))
        for session, outs, t in zip(sessions, token_outputs, trajectories, strict=True)
    ]
