"""Sync mode on verl: the trajectories of a batch run through ``recurrent``'s lockstep driver (any agent).

:func:`recurrent.generation_manager.run_lockstep` holds the schedule (each round holds every pending call of every
agent that is not flagged final, e.g. the memory agent's next memory update or three drafts made at once, and the
calls flagged final, the answers, form the last round); this module builds one episode per trajectory, sends each
call to verl's servers as a token-in/token-out request (with the call's own sampling over the trajectory's), and turns
every finished episode into its rows. verl's servers take one request per sequence, so a round is a set of
concurrent requests and the batching happens inside the server.

A failed trajectory leaves the lockstep and the rest go on (:func:`run_trajectories`); its prompt group is then
handled as in async mode.

Trade-off against async mode: the same agents, prompts and rows (the rollout distribution is identical);
async keeps the servers busy while long documents are still being read, lockstep idles them at every
barrier, so it is slower and only worth it for a faithful replay of the released training schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

from recurrent.generation_manager import run_lockstep
from recurrent.interface import Episode, Reply, Turn
from verl_ext.agent_loop import request_id_for
from verl_ext.rollout import AgentRollout, call_sampling_params


@dataclass
class Trajectory:
    """One rollout of one prompt: its dataset fields (``uid``, ``context``, ...), session id, sampling."""

    sample: dict[str, Any]
    session_id: int
    sampling_params: dict[str, Any]


async def run_trajectories(
    rollout: AgentRollout, server: Any, trajectories: list[Trajectory], report: bool = True
) -> list[list[AgentLoopOutput] | Exception]:
    """Run every trajectory to its end in lockstep rounds; returns each trajectory's rows (call order), or
    the exception that ended it. ``report``: print the batch's line (trajectories, rounds, failed); the preflight's
    trial episode is no batch of the run and prints none.

    A trajectory that fails (its episode cannot be built, e.g. a question over budget, or one of its requests
    fails) leaves the lockstep; the others go on. What happens to its prompt group is decided by the caller,
    as for async mode (verl_ext/agent_loop_manager.py).
    """
    results: list[list[AgentLoopOutput] | Exception | None] = [None] * len(trajectories)
    episodes: list[Episode] = []
    running: list[int] = []  # lockstep index -> trajectory index
    for i, trajectory in enumerate(trajectories):
        try:
            episodes.append(await rollout.episode(trajectory.sample))
            running.append(i)
        except Exception as err:
            results[i] = err

    async def generate(j: int, turn: Turn) -> Reply:
        i = running[j]
        sample = trajectories[i].sample
        params = call_sampling_params(trajectories[i].sampling_params, turn.sampling)
        prompt_ids = turn.prompt_ids if turn.prompt_ids is not None else rollout.render(turn.messages)
        return await rollout.call(server, request_id_for(sample), list(prompt_ids), turn.max_tokens, params)

    run = await run_lockstep(episodes, generate, rollout.deadline)
    for j, (episode, error) in enumerate(zip(episodes, run.errors, strict=True)):
        i = running[j]
        if error is not None:
            results[i] = error
            continue
        want_logprobs = bool(trajectories[i].sampling_params.get("logprobs"))
        try:
            results[i] = rollout.outputs(episode, want_logprobs=want_logprobs)
        except Exception as err:
            results[i] = err
    failed = sum(isinstance(result, Exception) for result in results)
    if report:
        print(
            f"[recurrent] lockstep: {len(trajectories)} trajectories in {len(run.rounds)} rounds, {failed} failed "
            f"({sum(run.calls)} calls)",
            flush=True,
        )
    return results  # type: ignore[return-value]
