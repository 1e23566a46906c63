"""The calculator tool is a bounded evaluator (issue 47): an expression a model writes can cost it at most a known,
small amount, checked before it runs; every refusal is the tool's error text, never an exception; and it runs off
the event loop within a deadline. The openai-client calculator cuts each result and reads the last user message."""

from __future__ import annotations

import asyncio
import threading

import pytest

from experiments.calculator import tool
from experiments.calculator.openai_agent import SYSTEM_PROMPT, CalculatorConfig, question
from experiments.calculator.tool import MAX_DIGITS, calculate, calculate_off_loop
from recurrent.async_manager import run_session
from recurrent.interface import Reply, load_register

CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "%s"}}</tool_call>'


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("(((9**64)**64)**64)**64", f"more than {MAX_DIGITS} digits"),  # hours of work unbounded
        ("((9**64)**64)**2", f"more than {MAX_DIGITS} digits"),  # over 4,300 digits: str() raised ValueError
        ("2 ** 1000", "exponent too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("1e308 * 10", "out of range"),
        ("1e308 * 10 - 1e308 * 10", "out of range"),
        ("+".join(["1"] * 70), "more than 64 numbers and operations"),
        ("1" * 300, "longer than 256 characters"),
        ("(" * 250 + "1" + ")" * 250, ""),  # too deep for the parser: its own error, as text
        ("__import__('os')", "unsupported expression"),
    ],
)
def test_an_expression_over_a_bound_is_refused_as_text(expression, error):
    result = calculate(expression)
    assert result.startswith("error: ") and error in result


def test_what_the_bounds_accept_is_computed_exactly():
    assert calculate("(17 + 3) * 4 / 8") == "10" and calculate("7 / 2") == "3.5"
    assert calculate("9 ** 64") == str(9**64)
    big = (9**64) ** 16  # 978 digits (3,248 bits): under the bound
    assert calculate("(9**64)**16") == str(big) and len(str(big)) <= MAX_DIGITS
    assert calculate("-1 % 10**64") == str(10**64 - 1)  # a remainder as large as its divisor, not its dividend
    # 3,248 + 203 bits could pass 1,000 digits: refused before multiplying
    assert calculate("(9**64)**16 * 9**64") == f"error: the result would have more than {MAX_DIGITS} digits"


def test_the_evaluation_runs_in_a_thread_and_past_its_deadline_answers_an_error(monkeypatch):
    entered, release = threading.Event(), threading.Event()

    def stuck(expression: str) -> str:
        entered.set()
        release.wait(60)
        return "never seen"

    async def main() -> tuple[str, str]:
        loop_thread = threading.get_ident()
        seen = []
        monkeypatch.setattr(tool, "calculate", lambda e: seen.append(threading.get_ident()) or "42")
        answered = await calculate_off_loop("6*7")
        assert seen and seen[0] != loop_thread  # not on the event loop's thread
        monkeypatch.setattr(tool, "calculate", stuck)
        monkeypatch.setattr(tool, "CALCULATE_SECONDS", 0.05)
        try:
            return answered, await calculate_off_loop("1+1")
        finally:
            release.set()

    answered, late = asyncio.run(main())
    assert answered == "42" and entered.is_set()
    assert late == "error: not evaluated within 0.05 s"


class Upstream:
    """An OpenAI-style client (evaluation): records what each call was sent, answers in order."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.sent: list[list[dict]] = []

    async def chat(self, messages, max_tokens, **options) -> Reply:
        self.sent.append([dict(m) for m in messages])
        return Reply(self.replies.pop(0), "stop", prompt_tokens=7, completion_tokens=3)


def run_openai_calculator(sample: dict, replies: list[str], **config) -> Upstream:
    episode = load_register("calculator_openai").for_inference(None, **config).episode(sample)
    upstream = Upstream(replies)
    asyncio.run(run_session(episode, upstream))
    return upstream


def test_the_openai_calculator_cuts_a_result_to_max_result_chars():
    upstream = run_openai_calculator({"prompt": "?"}, [CALL % "2**60", "\\boxed{1}"], max_result_chars=5)
    assert upstream.sent[1][-1]["role"] == "tool"
    assert upstream.sent[1][-1]["content"] == "11529"  # 1152921504606846976, cut to 5 characters


def test_the_openai_calculator_answers_a_refused_expression_with_its_error():
    upstream = run_openai_calculator({"prompt": "?"}, [CALL % "((9**64)**64)**2", "\\boxed{1}"], max_result_chars=64)
    assert upstream.sent[1][-1]["content"] == f"error: the result would have more than {MAX_DIGITS} digits"


def test_the_openai_calculator_asks_the_last_user_message():
    chat = [
        {"role": "user", "content": "An earlier question"},
        {"role": "assistant", "content": "An earlier answer"},
        {"role": "user", "content": "What is 6 * 7?"},
    ]
    upstream = run_openai_calculator({"prompt": chat}, ["\\boxed{42}"])
    asked = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "What is 6 * 7?"}]
    assert upstream.sent[0] == asked
    assert question({"q": chat}, "q") == "What is 6 * 7?"


def test_a_chat_without_a_user_message_is_a_value_error_that_names_it():
    with pytest.raises(ValueError, match="no user message"):
        question({"prompt": [{"role": "system", "content": "Be brief."}]}, CalculatorConfig().question_key)


@pytest.mark.timeout(10)
def test_an_expression_of_exactly_the_longest_length_is_computed():
    # docs/serving.md: an expression of at most 256 characters; 256 is computed, 257 refused
    longest = "12 * 3" + " " * 250
    assert len(longest) == tool.MAX_EXPRESSION_CHARS == 256
    assert calculate(longest) == "36"
    assert calculate(longest + " ") == "error: expression longer than 256 characters"
