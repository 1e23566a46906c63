"""A tool-using arithmetic agent, written as a plain async function: the framework's second agent.

The model may call a calculator by writing ``<tool_call>{"name": "calculate", "arguments": {"expression": "..."}}
</tool_call>``; the result comes back in the next user message as ``<tool_response>...</tool_response>`` and the
conversation grows with every call. A reply without a tool call is the answer (in ``\\boxed{}``), so the end is
known only from the reply. Every model call is one training row (the conversation so far as its prompt: tool
results are never trained on), and the last call, the answer, is the one the reward scores.

    recurrent.agent=calculator  (configs/calculator_cpu.yaml trains it on CPU; docs/write_your_own_agent.md)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from experiments.calculator.tool import calculate_off_loop
from recurrent.functions import CallRecorder, agent_function
from recurrent.interface import RowWidths, WorkflowConfig, question_text
from recurrent.templating import chat_prompt_ids

SYSTEM_PROMPT = (
    "You solve arithmetic problems and may use a calculator. To use it, write exactly\n"
    '<tool_call>{"name": "calculate", "arguments": {"expression": "<arithmetic expression>"}}</tool_call>\n'
    "and stop; the result comes back as <tool_response>...</tool_response>. "
    "When you know the answer, put it in \\boxed{}."
)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass
class CalculatorConfig(WorkflowConfig):
    question_key: str = "prompt"  # a question string, or a chat list whose last user message is the question
    system_prompt: str = SYSTEM_PROMPT
    max_turns: int = 5  # model calls per problem, tool calls included (the original's tool agent: 5)
    max_tokens_per_turn: int = 256  # (the original's: 256)
    # The question's budget in the row widths; a longer question can make the last call overflow a trainer's rows,
    # which then fails that trajectory (verl_ext/rollout.py checks every call).
    max_question_tokens: int = 256
    max_result_chars: int = 32  # a tool result is cut to this many characters (ASCII: at most as many tokens)

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_tokens_per_turn", "max_question_tokens", "max_result_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"CalculatorConfig.{name} must be at least 1, got {getattr(self, name)}")


async def solve(sample: dict[str, Any], client: CallRecorder, config: CalculatorConfig) -> str:
    """Call the model until a reply holds no tool call (the answer) or the calls run out (the last reply is then
    the answer, whatever it holds)."""
    messages = [
        {"role": "system", "content": config.system_prompt},
        {"role": "user", "content": question_text(sample, config.question_key)},
    ]
    for _ in range(config.max_turns):
        reply = await client.chat(messages, config.max_tokens_per_turn)
        expression = parse_tool_call(reply.text)
        if expression is None:
            break
        result = await calculate_off_loop(expression) if expression else "error: malformed tool call"
        messages.append({"role": "assistant", "content": reply.text})
        messages.append(
            {"role": "user", "content": f"<tool_response>{result[: config.max_result_chars]}</tool_response>"}
        )
    return reply.text


def parse_tool_call(text: str) -> str | None:
    """The expression of the first well-formed calculator call in ``text``, '' for a malformed one, else None."""
    match = _TOOL_CALL.search(text)
    if match is None:
        return None
    try:
        call = json.loads(match.group(1))
        return str(call["arguments"]["expression"]) if call.get("name") == "calculate" else ""
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
        return ""


def row_widths(config: CalculatorConfig, tokenizer: Any) -> RowWidths:
    """The last allowed call has the longest prompt: the system prompt and the question, then ``max_turns - 1``
    rounds of a reply and a tool result, each in the chat template. The template's own tokens are counted by
    rendering the conversation with empty contents; each reply adds at most ``max_tokens_per_turn`` tokens (its
    text re-encoded), each result at most ``max_result_chars`` (ASCII: a token per character at most)."""
    rounds = config.max_turns - 1
    empty = [{"role": "system", "content": config.system_prompt}, {"role": "user", "content": ""}]
    empty += [
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "<tool_response></tool_response>"},
    ] * rounds
    template = len(chat_prompt_ids(tokenizer, empty))
    prompt = template + config.max_question_tokens + rounds * (config.max_tokens_per_turn + config.max_result_chars)
    return RowWidths(
        prompt=prompt,
        response=config.max_tokens_per_turn,
        made_of=(
            f"system prompt and chat template {template}, question max_question_tokens={config.max_question_tokens}, "
            f"{rounds} rounds (max_turns={config.max_turns}) of a reply max_tokens_per_turn="
            f"{config.max_tokens_per_turn} and a result max_result_chars={config.max_result_chars}"
        ),
    )


REGISTER = agent_function(
    "calculator", CalculatorConfig, solve, columns=lambda config: (config.question_key,), row_widths=row_widths
)
