"""The second workflow (``examples/calculator_workflow.py``): a growing conversation with a calculator tool,
driven by hand."""

import inspect
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from recurrent.interface import Reply, load_register

# The example is loaded as a user's workflow file is (recurrent.path=examples/calculator_workflow.py).
EXAMPLE = Path(__file__).parents[2] / "examples" / "calculator_workflow.py"
REGISTER = load_register(str(EXAMPLE))
CalculatorConfig, CalculatorWorkflow = REGISTER.config_cls, REGISTER.workflow_cls
_module = inspect.getmodule(CalculatorWorkflow)
calculate, parse_tool_call = _module.calculate, _module.parse_tool_call


def test_calculate_and_parse():
    assert calculate("(17 + 3) * 4 / 8") == "10"
    assert calculate("2 ** 10 - 1") == "1023"
    assert calculate("7 / 2") == "3.5"
    assert calculate("1 / 0").startswith("error")
    assert calculate("__import__('os')").startswith("error")
    assert calculate("2 ** 1000").startswith("error")
    call = '<tool_call>{"name": "calculate", "arguments": {"expression": "6*7"}}</tool_call>'
    assert parse_tool_call("I will compute. " + call) == "6*7"
    assert parse_tool_call("<tool_call>not json</tool_call>") == ""
    assert parse_tool_call("The answer is \\boxed{42}") is None


@pytest.fixture(scope="module")
def workflow(tiny_model_dir):
    return CalculatorWorkflow(CalculatorConfig(max_turns=3), AutoTokenizer.from_pretrained(tiny_model_dir))


def test_tool_results_grow_the_conversation(workflow):
    session = workflow.session({"prompt": [{"role": "user", "content": "What is 6 times 7?"}]})
    first = session.next_turn()
    assert [m["role"] for m in first.messages] == ["system", "user"] and not first.final
    call = '<tool_call>{"name": "calculate", "arguments": {"expression": "6*7"}}</tool_call>'
    session.record(Reply(call, "stop"))
    second = session.next_turn()
    assert [m["role"] for m in second.messages] == ["system", "user", "assistant", "user"]
    assert second.messages[-1]["content"] == "<tool_response>42</tool_response>"
    assert second.messages[2]["content"] == call
    # The token prompt is the chat template over the whole conversation so far: the tiny model's ChatML, written
    # out by hand from the four messages.
    system = second.messages[0]["content"]
    assert system == first.messages[0]["content"] and system
    expected = (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nWhat is 6 times 7?<|im_end|>\n"
        f"<|im_start|>assistant\n{call}<|im_end|>\n<|im_start|>user\n<tool_response>42</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert workflow.tokenizer.decode(second.prompt_ids) == expected
    session.record(Reply("So the answer is \\boxed{42}", "stop"))  # no tool call: the session ends here
    assert session.next_turn() is None
    assert len(session.history) == 2 and session.trace()["tool_calls"] == 1


def test_last_allowed_turn_is_flagged_final(workflow):
    session = workflow.session({"prompt": "1+1?"})
    call = '<tool_call>{"name": "calculate", "arguments": {"expression": "1+1"}}</tool_call>'
    flags = []
    while (turn := session.next_turn()) is not None:
        flags.append(turn.final)
        session.record(Reply(call, "stop"))
    assert flags == [False, False, True]  # max_turns=3: the third call is known to be the last


def test_registered():
    assert REGISTER.name == "calculator"
