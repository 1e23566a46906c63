"""A user's agent written against the official ``openai`` client, as it would run against a hosted model: nothing
of the framework but its registration's one line. A draft (with a calculator tool it may call), then a check of
the draft; the check's reply is the answer. tests/test_openai_agent.py trains it and evaluates it by its path."""

import json
from dataclasses import dataclass

from openai import AsyncOpenAI

from recurrent.openai_agents import openai_agent

DRAFT = "{question}\nWrite a short draft answer."
CHECK = "Check the draft and put the final answer in \\boxed{}."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate 'a op b' for integers a, b and op one of + - *.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


@dataclass
class DraftCheckConfig:
    max_tokens: int = 32  # new tokens per call
    model: str = "policy"


def calculate(arguments: str) -> str:
    a, op, b = json.loads(arguments)["expression"].split()
    return str({"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op])


async def draft_then_check(sample: dict, client: AsyncOpenAI, config: DraftCheckConfig) -> str:
    messages = [{"role": "user", "content": DRAFT.format(question=sample["input"])}]
    draft = await client.chat.completions.create(
        model=config.model, messages=messages, max_tokens=config.max_tokens, tools=TOOLS
    )
    message = draft.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(call.function.arguments)})
    messages.append({"role": "user", "content": CHECK})
    final = await client.chat.completions.create(model=config.model, messages=messages, max_tokens=config.max_tokens)
    return final.choices[0].message.content


REGISTER = openai_agent("draft_check_openai", DraftCheckConfig, draft_then_check, columns=("input",))
