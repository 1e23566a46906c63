"""Writing your own workflow: arithmetic word problems with a calculator tool.

A workflow is a file or module holding ``REGISTER = WorkflowRegistration(...)``; ``recurrent.interface.load_register``
loads it by module or file path, and the async manager and the lockstep driver run it exactly as they run the
memory agent. (Training with verl builds rows against the memory agent's token budgets, ``verl_ext/rollout.py``;
another workflow would bring its own budget check.) This one keeps the framework general: unlike the memory
agent, its conversation *grows* (each turn's prompt is the whole conversation so far, tool results included),
and whether a turn is the last one is only known after the reply (no tool call means the answer is given).
Nothing in the drivers knows about either.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from dataclasses import dataclass
from typing import Any

from recurrent.impls.memory import question_text
from recurrent.interface import Reply, Session, Turn, TurnRecord, Workflow, WorkflowConfig, WorkflowRegistration

SYSTEM_PROMPT = (
    "You solve arithmetic problems and may use a calculator. To use it, write exactly\n"
    '<tool_call>{"name": "calculate", "arguments": {"expression": "<arithmetic expression>"}}</tool_call>\n'
    "and stop; the result comes back as <tool_response>...</tool_response>. "
    "When you know the answer, put it in \\boxed{}."
)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


@dataclass
class CalculatorConfig(WorkflowConfig):
    question_key: str = "prompt"
    max_turns: int = 5  # model calls per sample, tool calls included
    max_tokens_per_turn: int = 256


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression safely (numbers, + - * / // % **, parentheses); errors as text."""
    try:
        value = _evaluate(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, TypeError) as err:
        return f"error: {err}"
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _evaluate(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent too large")
        return _OPERATORS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    raise ValueError(f"unsupported expression: {ast.dump(node)[:80]}")


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


class CalculatorWorkflow(Workflow):
    def __init__(self, config: CalculatorConfig, tokenizer: Any, token_prompts: bool = True) -> None:
        super().__init__(config, tokenizer)
        self.token_prompts = token_prompts

    def session(self, sample: dict[str, Any]) -> CalculatorSession:
        return CalculatorSession(self, question_text(sample, self.config.question_key))


class CalculatorSession(Session):
    def __init__(self, workflow: CalculatorWorkflow, question: str) -> None:
        self.workflow = workflow
        self.config: CalculatorConfig = workflow.config
        self.messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
        self.tool_calls = 0
        self._history: list[TurnRecord] = []
        self._pending: Turn | None = None
        self._done = False

    def next_turn(self) -> Turn | None:
        if self._done:
            return None
        last = len(self._history) + 1 >= self.config.max_turns
        prompt_ids = None
        if self.workflow.token_prompts:
            prompt_ids = list(
                self.workflow.tokenizer.apply_chat_template(
                    self.messages, add_generation_prompt=True, tokenize=True, return_dict=False
                )
            )
        self._pending = Turn(
            messages=[dict(m) for m in self.messages],
            max_tokens=self.config.max_tokens_per_turn,
            prompt_ids=prompt_ids,
            final=last,
            meta={"kind": "calculator", "turn": len(self._history)},
        )
        return self._pending

    def record(self, reply: Reply) -> None:
        turn, self._pending = self._pending, None
        if turn is None:
            raise RuntimeError("record called without a pending turn")
        self._history.append(TurnRecord(turn, reply))
        self.messages.append({"role": "assistant", "content": reply.text})
        expression = parse_tool_call(reply.text)
        if turn.final or expression is None:
            self._done = True
            return
        self.tool_calls += 1
        result = calculate(expression) if expression else "error: malformed tool call"
        self.messages.append({"role": "user", "content": f"<tool_response>{result}</tool_response>"})

    @property
    def history(self) -> list[TurnRecord]:
        return self._history

    def trace(self) -> dict[str, Any]:
        return {**super().trace(), "tool_calls": self.tool_calls}


REGISTER = WorkflowRegistration(name="calculator", config_cls=CalculatorConfig, workflow_cls=CalculatorWorkflow)
