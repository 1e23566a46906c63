"""The calculator agents' tool: an arithmetic expression evaluated safely (numbers, + - * / // % **, parentheses),
its errors as text. Plain Python, shared by the agent over the framework's client (experiments/calculator/agent.py)
and the one over the ``openai`` client (experiments/calculator/openai_agent.py).

The expression is the model's, so a prompt can steer it: every expression's cost is bounded before any of it is
evaluated (docs/serving.md, "What a request costs"). It is at most :data:`MAX_EXPRESSION_CHARS` characters and
:data:`MAX_OPERATIONS` operations; an exponent is at most :data:`MAX_EXPONENT`; and before each operation on
integers the size of its result is bounded from its operands' sizes, an operation whose result could pass
:data:`MAX_DIGITS` digits refused unrun. Every operation is then on numbers of at most ~3,300 bits: the worst
expression accepted takes well under a millisecond (timed by ``scripts/bench_serve.py --soak``). The agents call it
through :func:`calculate_off_loop`, in a worker thread within :data:`CALCULATE_SECONDS`, so that even a slow machine
never holds the event loop that serves other requests.
"""

from __future__ import annotations

import ast
import asyncio
import math
import operator

MAX_EXPRESSION_CHARS = 256  # a model's tool call; a longer expression is refused unparsed
MAX_OPERATIONS = 64  # operators and numbers together
MAX_EXPONENT = 64  # |exponent| of **
MAX_DIGITS = 1000  # decimal digits of any integer an operation may produce
MAX_BITS = math.ceil(MAX_DIGITS * math.log2(10))  # the same bound in bits, checked before each operation
CALCULATE_SECONDS = 1.0  # the deadline of one evaluation in its worker thread (its bounded cost is ~1 ms)

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


class CalculatorError(ValueError):
    """An expression the calculator refuses: its message is the tool's answer (after ``error: ``)."""


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression safely (numbers, + - * / // % **, parentheses), its cost bounded before
    it runs (module docstring); every error is text starting with ``error:``, never an exception."""
    try:
        if len(expression) > MAX_EXPRESSION_CHARS:
            raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
        tree = ast.parse(expression, mode="eval").body
        operations = sum(isinstance(node, ast.BinOp | ast.UnaryOp | ast.Constant) for node in ast.walk(tree))
        if operations > MAX_OPERATIONS:
            raise CalculatorError(f"more than {MAX_OPERATIONS} numbers and operations")
        return _text(_evaluate(tree))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, TypeError, RecursionError, MemoryError) as err:
        return f"error: {err}"


async def calculate_off_loop(expression: str) -> str:
    """:func:`calculate` in a worker thread, within :data:`CALCULATE_SECONDS`: the agent's event loop (the
    endpoint's, the trainer's) serves everything else meanwhile; past the deadline the answer is an error text."""
    try:
        async with asyncio.timeout(CALCULATE_SECONDS):
            return await asyncio.to_thread(calculate, expression)
    except TimeoutError:
        return f"error: not evaluated within {CALCULATE_SECONDS:g} s"


def _text(value: float | int) -> str:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CalculatorError("the result is out of range")
        return str(int(value)) if value.is_integer() else str(value)
    return str(value)


def _evaluate(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError("exponent too large")
        _check_size(node.op, left, right)
        value = _OPERATORS[type(node.op)](left, right)
        if isinstance(value, complex):  # a negative number to a fractional power
            raise CalculatorError("the result is not a real number")
        return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    raise CalculatorError(f"unsupported expression: {ast.dump(node)[:80]}")


def _check_size(op: ast.operator, left: float | int, right: float | int) -> None:
    """Refuse, before it runs, an operation on integers whose result could have more than :data:`MAX_BITS` bits
    (floats are bounded by their type: an overflow raises or gives inf, refused by :func:`_text`)."""
    if not (isinstance(left, int) and isinstance(right, int)):
        return
    a, b = left.bit_length(), right.bit_length()
    if isinstance(op, ast.Add | ast.Sub):
        bits = max(a, b) + 1
    elif isinstance(op, ast.Mult):
        bits = a + b
    elif isinstance(op, ast.Pow):
        bits = a * max(right, 1)
    elif isinstance(op, ast.Mod):  # below the divisor (in magnitude), whatever the dividend
        bits = max(a, b)
    else:  # / //: no larger than the dividend
        bits = a
    if bits > MAX_BITS:
        raise CalculatorError(f"the result would have more than {MAX_DIGITS} digits")
