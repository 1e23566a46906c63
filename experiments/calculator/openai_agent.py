"""The calculator agent (experiments/calculator/agent.py) written against the official ``openai`` client and its tools
API: the same task, prompt and tool, and on the same replies the same training rows, token for token
(tests/verl_ext/test_vx_openai_rows.py). Nothing of the framework but the registration's one line.

The model calls ``calculate`` through ``tools=``; a reply's ``message.tool_calls`` are answered with ``tool``
messages and the conversation grows; a reply without calls is the answer (in ``\\boxed{}``). Where a chat template
renders tools itself (Qwen2.5, Qwen3) the tool is described there too; the tiny CPU model's template cannot, so
the system prompt describes it as the text calculator's does.

    recurrent.agent=calculator_openai  (configs/calculator_cpu.yaml's settings; docs/write_your_own_agent.md)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from openai import AsyncOpenAI

from experiments.calculator.tool import calculate_off_loop  # the tool itself: plain Python, no framework
from recurrent.openai_agents import openai_agent

SYSTEM_PROMPT = (
    "You solve arithmetic problems and may use a calculator. To use it, write exactly\n"
    '<tool_call>{"name": "calculate", "arguments": {"expression": "<arithmetic expression>"}}</tool_call>\n'
    "and stop; the result comes back as <tool_response>...</tool_response>. "
    "When you know the answer, put it in \\boxed{}."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate an arithmetic expression: numbers, + - * / // % **, parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. (17 + 3) * 4"}},
                "required": ["expression"],
            },
        },
    }
]
MALFORMED = "error: malformed tool call"  # the text calculator's answer to a call it cannot read


@dataclass
class CalculatorConfig:
    question_key: str = "prompt"  # a question string, or a chat list whose last user message is the question
    system_prompt: str = SYSTEM_PROMPT
    max_turns: int = 5  # model calls per problem, tool calls included
    max_tokens_per_turn: int = 256
    max_question_tokens: int = 256  # the text calculator's setting, kept so one run config serves both
    max_result_chars: int = 32  # a tool result is cut to this many characters
    model: str = "policy"  # sent with each request; the run's model answers whatever it says


async def solve(sample: dict[str, Any], client: AsyncOpenAI, config: CalculatorConfig) -> str:
    """Call the model until a reply has no tool call (the answer) or the calls run out."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": config.system_prompt},
        {"role": "user", "content": question(sample, config.question_key)},
    ]
    for _ in range(config.max_turns):
        completion = await client.chat.completions.create(
            model=config.model, messages=messages, max_tokens=config.max_tokens_per_turn, tools=TOOLS
        )
        message = completion.choices[0].message
        if not message.tool_calls:
            break
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = await run_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result[: config.max_result_chars]})
    return message.content or ""


def question(sample: dict[str, Any], key: str) -> str:
    """A string column, or the last user message of a chat list (verl's ``prompt`` column)."""
    value = sample[key]
    if isinstance(value, str):
        return value
    users = [m for m in value if m.get("role") == "user"]
    if not users:
        raise ValueError(f"the {key!r} chat has no user message: no question to ask")
    return users[-1]["content"]


async def run_tool(name: str, arguments: str) -> str:
    """The result of one call: the expression's value, or an error as text (evaluated off the event loop)."""
    try:
        expression = json.loads(arguments)["expression"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return MALFORMED
    return await calculate_off_loop(str(expression)) if name == "calculate" else MALFORMED


REGISTER = openai_agent("calculator_openai", CalculatorConfig, solve, columns=lambda config: (config.question_key,))
