"""The memory agent as a verl agent loop (async mode): one coroutine per trajectory.

Registered in verl's agent-loop registry as ``memory_agent`` (select it with
``actor_rollout_ref.rollout.agent.default_agent_loop=memory_agent``). verl's V1 worker
(``AgentLoopWorkerTQ``) runs ``rollout.n`` of these per prompt; each ``run`` drives one ``recurrent``
session to its end and returns one output per memory-update turn plus the final answer. The worker then
scores the last output, copies the reward to the earlier ones and stores every output as its own row
``{uid}_{session_id}_{index}`` (``verl/trainer/ppo/v1/agent_loop_tq.py:150-227``).
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
from verl.workers.rollout.replica import TokenOutput

from verl_ext.rollout import MemoryRollout

AGENT_NAME = "memory_agent"


def request_id_for(sample: dict[str, Any]) -> str:
    """All turns of all sessions of one prompt share a request id: verl's load balancer routes them to
    one server (sticky sessions), where their shared prefixes (template, question, first chunk) are cached."""
    uid = sample.get("uid")
    return str(uid) if uid is not None else uuid4().hex


@register(AGENT_NAME)
class MemoryAgentLoop(AgentLoopBase):
    """Drive one memory-agent session through verl's LLM server client, turn by turn."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        rollout = MemoryRollout.get(self.config, self.tokenizer)
        session = await rollout.session(kwargs)
        request_id = request_id_for(kwargs)
        token_outputs: list[TokenOutput] = []
        while (turn := session.next_turn()) is not None:
            output, reply = await rollout.call(
                self.server_manager, request_id, turn.prompt_ids, turn.max_tokens, sampling_params
            )
            session.record(reply)
            token_outputs.append(output)
        return rollout.outputs(session, token_outputs, want_logprobs=bool(sampling_params.get("logprobs")))
