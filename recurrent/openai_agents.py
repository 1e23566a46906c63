"""Agents written against the official ``openai`` client, registered in one line::

    from openai import AsyncOpenAI
    from recurrent.openai_agents import openai_agent

    async def solve(sample: dict, client: AsyncOpenAI, config: SolveConfig) -> str:
        completion = await client.chat.completions.create(model="policy", messages=[...], max_tokens=64)
        return completion.choices[0].message.content

    REGISTER = openai_agent("solve", SolveConfig, solve, columns=("prompt",))

The function is an agent function (recurrent/functions.py) whose client is an ``openai.AsyncOpenAI``: every
``chat.completions.create`` goes through the episode's recording route (recurrent/openai_route.py), one call, one
training row. In training the route renders each request with the tokenizer's chat template (its ``tools``
included) and the row holds the ids the rollout sampled; in evaluation and serving the request goes to the run's
upstream as it is. ``model`` is ignored: the run's model answers. The same answer rule holds as for any agent
function: it returns its last call's reply text (``message.content`` of a reply without tool calls).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from openai import AsyncOpenAI

from recurrent.functions import AgentFunction, Answer, CallRecorder, FunctionWorkflow, RowWidthsOf
from recurrent.interface import Columns, Workflow, WorkflowConfig, WorkflowRegistration
from recurrent.openai_route import RecordingRoute, Render, recording_client
from recurrent.templating import chat_prompt_ids
from recurrent.tool_calls import as_text_messages, renders_tools, template_messages

OpenAIAgent = Callable[[Any, AsyncOpenAI, Any], Awaitable["str | Answer"]]  # (sample, client, config) -> answer


def template_render(tokenizer: Any) -> Render | None:
    """How training renders a request: vLLM's way into the tokenizer's chat template, or, for a template without
    tool support, with tool calls and results written as text in the Qwen format (recurrent/tool_calls.py)."""
    if tokenizer is None:
        return None
    shape = template_messages if renders_tools(tokenizer) else as_text_messages

    def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, max_tokens: int | None) -> list[int]:
        return chat_prompt_ids(tokenizer, shape(messages), tools=tools, max_tokens=max_tokens)

    return render


def through_route(agent: OpenAIAgent, render: Render | None, max_tokens: int | None = None) -> AgentFunction:
    """``agent`` as an agent function: it gets an ``AsyncOpenAI`` over the recording route of its episode."""

    async def run(sample: Any, recorder: CallRecorder, config: Any) -> str | Answer:
        route = RecordingRoute(recorder, render, max_tokens)
        client = recording_client(route)
        try:
            answer = await agent(sample, client, config)
        finally:
            await client.close()
        if isinstance(answer, Answer):
            return Answer(route.answer_text(answer.text), answer.score)
        return route.answer_text(answer)

    return run


def openai_agent(
    name: str,
    config_cls: type[WorkflowConfig],
    agent: OpenAIAgent,
    *,
    columns: Columns = (),
    large_columns: Columns = (),
    row_widths: RowWidthsOf | None = None,
    max_tokens: int | None = None,
) -> WorkflowRegistration:
    """The registration of an ``openai``-client agent (its module's ``REGISTER``). ``columns``, ``large_columns``
    and ``row_widths`` as for :func:`recurrent.functions.agent_function`; ``max_tokens``: the cap of a request
    that sets none (without it, such a request is refused: a training row needs a cap)."""

    def make(config: WorkflowConfig, tokenizer: Any, render: Render | None) -> FunctionWorkflow:
        run = through_route(agent, render, max_tokens)
        columns_of = registration.columns_of(config)
        return FunctionWorkflow(config, tokenizer, name=name, agent=run, columns=columns_of, row_widths=row_widths)

    registration = OpenAIAgentRegistration(
        name=name,
        config_cls=config_cls,
        build=lambda config, tokenizer: make(config, tokenizer, template_render(tokenizer)),
        upstream_build=lambda config, tokenizer: make(config, tokenizer, None),
        columns=columns,
        large_columns=large_columns,
        needs_tokenizer=False,
        source=agent,
    )
    return registration


@dataclass(frozen=True)
class OpenAIAgentRegistration(WorkflowRegistration):
    """An ``openai``-client agent's registration: built for training, its route renders each request into token
    ids; built for evaluation and serving, the route sends it upstream as it is. (Not through ``inference``: that
    builder takes the memory agent's budget flags: docs/serving.md, "Another agent")."""

    upstream_build: Callable[[WorkflowConfig, Any], Workflow] | None = None

    def for_inference(self, tokenizer: Any, **options: Any) -> Workflow:
        if self.upstream_build is None:
            return super().for_inference(tokenizer, **options)
        return self.upstream_build(self.make_config(options), tokenizer)
