"""The calculator agents' tool: an arithmetic expression evaluated safely (numbers, + - * / // % **, parentheses),
its errors as text. Plain Python, shared by the agent over the framework's client (experiments/calculator/agent.py)
and the one over the ``openai`` client (experiments/calculator/openai_agent.py)."""

from __future__ import annotations

import ast
import operator

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


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression safely (numbers, + - * / // % **, parentheses); errors as text."""
    try:
        value = _evaluate(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, TypeError, RecursionError) as err:
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
