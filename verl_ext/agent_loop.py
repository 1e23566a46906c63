"""Any registered agent as a verl agent loop (async mode): one coroutine per trajectory.

Registered in verl's agent-loop registry as ``recurrent_agent`` (``configs/recurrent_trainer.yaml`` selects it with
``actor_rollout_ref.rollout.agent.default_agent_loop``). verl's V1 worker (``AgentLoopWorkerTQ``) runs
``rollout.n`` of these per prompt; each ``run`` drives one episode of the agent named by ``recurrent.agent`` to its
end and returns one output per model call, the answer last. The worker then scores the last output, copies the
reward to the earlier ones and stores every output as its own row ``{uid}_{session_id}_{index}``
(``verl/trainer/ppo/v1/agent_loop_tq.py:150-227``).
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

from recurrent.async_manager import run_session
from verl_ext.rollout import AgentRollout, TokenClient

AGENT_LOOP_NAME = "recurrent_agent"


def request_id_for(sample: dict[str, Any]) -> str:
    """All calls of all trajectories of one prompt share a request id: verl's load balancer routes them to one
    server (sticky sessions), where their shared prefixes (template, question, first chunk) are cached."""
    uid = sample.get("uid")
    return str(uid) if uid is not None else uuid4().hex


@register(AGENT_LOOP_NAME)
class RecurrentAgentLoop(AgentLoopBase):
    """Drive one episode of the configured agent through verl's LLM server client, call by call."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        rollout = AgentRollout.get(self.config, self.tokenizer)
        episode = await rollout.episode(kwargs)
        client = TokenClient(rollout, self.server_manager, request_id_for(kwargs), sampling_params)
        await run_session(episode, client, deadline=rollout.deadline)
        return rollout.outputs(episode, want_logprobs=bool(sampling_params.get("logprobs")))
